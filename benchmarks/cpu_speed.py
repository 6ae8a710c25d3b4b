"""CPU replay speed of the `small` preset: lines/s, tokens/s, and the share of time in the engine.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/cpu_speed.py [--lines 4000] [--hosts 16] [--window 2048]

Trains a `small` model briefly on synthetic lines (speed does not depend on how well it is
trained), then scores a synthetic log with `--hosts` web hosts batched together, through the
same Detector that replay and serve use. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch

from logstream.detector import Detector
from logstream.inputs import streams_from_lines
from logstream.records import LogRecord
from logstream.synth import STREAM_KEY, generate_lines
from logstream.train import TrainConfig, train

BATCH_LINES = 1024  # as replay does


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--preset", default="small")
    args = parser.parse_args()
    key = re.compile(STREAM_KEY)

    baseline = generate_lines(2000, seed=1, web_hosts=args.hosts)
    trained = train(
        streams_from_lines(baseline.lines, key),
        TrainConfig(preset=args.preset, window=args.window, fit_window=False, max_steps=20, batch_size=4),
    )
    detector = Detector(trained.model, trained.tokenizer, trained.meta, device="cpu", max_streams=64)
    log = generate_lines(args.lines, seed=2, web_hosts=args.hosts)
    records = [LogRecord(line=line, stream=key.search(line).group(1)) for line in log.lines]
    tokens = sum(
        len(ids)
        for ids in detector.tokenizer.encode_lines([detector.normalizer.mask(r.line) for r in records])
    )

    engine_seconds = 0.0
    engine_score = detector.engine.score

    def timed_engine_score(batch: dict) -> dict:
        nonlocal engine_seconds
        started = time.perf_counter()
        try:
            return engine_score(batch)
        finally:
            engine_seconds += time.perf_counter() - started

    detector.engine.score = timed_engine_score  # type: ignore[method-assign]
    detector.score(records[:64])  # warm-up
    engine_seconds = 0.0
    started = time.perf_counter()
    for start in range(0, len(records), BATCH_LINES):
        detector.score(records[start : start + BATCH_LINES])
    seconds = time.perf_counter() - started
    result = {
        "preset": args.preset,
        "window": args.window,
        "streams": len({r.stream for r in records}),
        "lines": len(records),
        "tokens": tokens,
        "lines_per_second": round(len(records) / seconds, 1),
        "tokens_per_second": round(tokens / seconds, 1),
        "engine_share": round(engine_seconds / seconds, 3),
        "cache_bytes_per_stream": detector.engine.bytes_per_stream,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
