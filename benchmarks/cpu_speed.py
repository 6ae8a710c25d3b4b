"""CPU replay speed: lines/s, tokens/s, FLOP/s and bytes/s against this machine's roofline, per lever.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/cpu_speed.py [--preset small] [--lines 1000]
        [--hosts 16] [--window 2048] [--reps 2] [--levers reference,flash_cpu,chunk_1024,...] [--one-stream]
        [--skewed] [--workers 2]

Trains a model briefly on synthetic lines (speed does not depend on how well it is trained;
the drift column does a little), tokenizes a synthetic log with `--hosts` web hosts, fills
every stream's ring with its earlier lines (untimed: the steady state of a long-running
stream), then scores `--lines` more lines in replay's batches (`LINE_BATCH`), once per
lever and repetition, interleaved, best time kept (the machine is shared: compare within a
run). Each lever's token NLLs are compared with the first lever's (`drift`).
`--merge-across-words` trains the tokenizer with merges across spaces (a common line is one
token): compare its lines/s with a run without it.

Levers (LEVERS): the torch reference attention (`LOGSTREAM_FORCE_REFERENCE=1`), flash_cpu (the
default), bigger or smaller chunks per step, torch.compile of `StreamingEngine.device_step`, bf16 weights
and cache, one thread instead of two, an int8 ring, one chunk per stream a step (the default takes
several when few streams are active), one step for all of a round's streams (the default splits
them by chunk length). `--skewed` keeps 1/(i + 1) of the i-th stream's
timed lines: one busy stream and a long tail. Then the default Detector end to end (masking,
tokenizing, mining, scoring; best of --reps): the engine's share and the host's microseconds
per line. FLOPs per token: `roofline.engine_flops_per_token`
at each token's own window; bytes: `roofline.engine_bytes_per_step`. The roofline is sampled
at the start and after each repetition, and the shares divide by the highest sample
(`roofline.highest`): on a shared machine one sample can be half the ceiling.
`--workers N` then runs N such Detectors at once, each in its own process with one torch
thread, each scoring whole streams, dealt so that the workers' line counts are as even as they
can be (the busiest stream first, to the least loaded worker): what N serve replicas of one
consumer group do on N cores when their partitions carry even traffic. It prints their lines/s
together, timed from a barrier that all pass with full rings until the last worker is done.
The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import os
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from roofline import Roofline, engine_bytes_per_step, engine_flops_per_token, highest, measure

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.detector import Detector
from logstream.engine.kernels.dispatch import FORCE_REFERENCE_ENV
from logstream.engine.model import save_model_dir
from logstream.engine.streaming import CPU_STEP_CHUNKS, STEP_ROWS, StepFn, StreamingEngine
from logstream.engine.tokenizer import prompt_ids
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.lifecycle.train import TrainConfig, train
from logstream.records import LogRecord
from logstream.replay import LINE_BATCH

Batch = dict[str, list[list[int]]]


@dataclass(frozen=True)
class Lever:
    reference: bool = False  # LOGSTREAM_FORCE_REFERENCE=1: the torch reference attention
    chunk_tokens: int = 256
    compile: bool = False  # engine.step_fn = torch.compile(engine.device_step)
    dtype: torch.dtype = torch.float32
    threads: int | None = None  # None: as OMP_NUM_THREADS
    int8_ring: bool = False  # K/V stored as int8 with per (token, kv head) scales
    step_chunks: int = CPU_STEP_CHUNKS  # 1: one chunk per stream a step, never several
    step_rows: int = STEP_ROWS  # huge: a round's streams never split by length


LEVERS: dict[str, Lever] = {
    "reference": Lever(reference=True),
    "flash_cpu": Lever(),
    "chunk_1024": Lever(chunk_tokens=1024),
    "chunk_64": Lever(chunk_tokens=64),
    "compile": Lever(compile=True),
    "compile_chunk_1024": Lever(compile=True, chunk_tokens=1024),
    "bf16": Lever(dtype=torch.bfloat16),
    "threads_1": Lever(threads=1),
    "int8_ring": Lever(int8_ring=True),
    "one_chunk_a_step": Lever(step_chunks=1),
    "one_step_a_round": Lever(step_rows=2**62),
}


class Counted:
    """The engine's step (`engine.step_fn`, or `device_step`), wrapped: counts FLOPs and the bytes
    each step must read."""

    def __init__(self, engine: StreamingEngine) -> None:
        self.engine, self.step = engine, engine.step_fn or engine.device_step
        self.flops = self.bytes = 0.0
        config, S = engine.model.config, engine.sink_k[0].shape[1]
        self.base = engine_flops_per_token(config, S, 0)  # FLOPs per token at W = 0
        self.per_key = engine_flops_per_token(config, S, 1) - self.base  # + this per window key

    def __call__(self, tokens: torch.Tensor, previous: torch.Tensor, slots: torch.Tensor, position: torch.Tensor,
                 chunk_len: torch.Tensor, ring_len: int, fill_all: bool = False) -> Any:  # fmt: skip
        B, T = tokens.shape
        L = self.engine.window
        fill = position.clamp(max=L)
        window = torch.clamp(fill[:, None] + torch.arange(T)[None] + 1, max=L)  # [B, T]: each token's W
        real = torch.arange(T)[None] < chunk_len[:, None]  # [B, T]
        self.flops += float(real.sum()) * self.base + float(window[real].sum()) * self.per_key
        self.bytes += engine_bytes_per_step(
            self.engine.model.config, B, ring_len, self.engine.ring_k.element_size()
        )
        return self.step(tokens, previous, slots, position, chunk_len, ring_len, fill_all)


class Timed:
    """The engine's step, wrapped: adds up the seconds it takes (synchronous on the CPU)."""

    def __init__(self, step: StepFn) -> None:
        self.step, self.seconds = step, 0.0

    def __call__(self, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.step(*args)
        finally:
            self.seconds += time.perf_counter() - started


def run_lever(
    engine: StreamingEngine, prefill: Batch, batches: list[Batch], reference: bool
) -> tuple[float, dict[str, list[np.ndarray]], Counted]:
    """(seconds to score `batches` after a reset and an untimed prefill, NLLs, counts).

    The prefill always takes the default attention (the reference's rings differ by rounding
    only, and it is 3-6x slower); `reference` switches the timed part to the torch reference.
    """
    for stream in list(engine.streams):
        engine.drop(stream)
    os.environ[FORCE_REFERENCE_ENV] = "0"
    engine.score(prefill)
    os.environ[FORCE_REFERENCE_ENV] = "1" if reference else "0"
    previous, counted = engine.step_fn, Counted(engine)
    engine.step_fn = counted
    nll: dict[str, list[np.ndarray]] = defaultdict(list)
    started = time.perf_counter()
    for batch in batches:
        for stream, lines in engine.score(batch).items():
            nll[stream] += lines
    seconds = time.perf_counter() - started
    engine.step_fn = previous
    return seconds, nll, counted


def drift(got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> tuple[float, float]:
    """(max |token NLL difference|, max |line mean NLL difference|), nats."""
    token = line = 0.0
    for stream, lines in want.items():
        for a, b in zip(got[stream], lines, strict=True):
            token = max(token, float(np.abs(a - b).max(initial=0.0)))
            line = max(line, abs(float(a.mean() - b.mean())) if len(a) else 0.0)
    return token, line


def skewed(records: list[LogRecord], ids: list[list[int]]) -> tuple[list[LogRecord], list[list[int]]]:
    """The first 1/(i + 1) of the i-th stream's lines (streams by name), in order: one busy stream
    and a long tail, as a poll's streams often are. A step pads the short streams' chunks."""
    counts = Counter(record.stream for record in records)
    keep = {stream: max(1, counts[stream] // (i + 1)) for i, stream in enumerate(sorted(counts))}
    taken: Counter[str] = Counter()
    kept = []
    for record, line in zip(records, ids, strict=True):
        if taken[record.stream] < keep[record.stream]:
            taken[record.stream] += 1
            kept.append((record, line))
    return [record for record, _ in kept], [line for _, line in kept]


def by_stream(records: list[LogRecord], ids: list[list[int]]) -> list[Batch]:
    """Batches of LINE_BATCH records, grouped by stream in order (as Detector.score does)."""
    batches = []
    for start in range(0, len(records), LINE_BATCH):
        batch: Batch = defaultdict(list)
        for record, line in zip(
            records[start : start + LINE_BATCH], ids[start : start + LINE_BATCH], strict=True
        ):
            batch[record.stream].append(line)
        batches.append(dict(batch))
    return batches


def score_in_worker(
    model_dir: str, prefill: Batch, records: list[LogRecord], barrier: Any, done: Any
) -> None:
    """One worker of `--workers`: a Detector on one thread fills its streams' rings, waits at
    `barrier`, scores `records` in replay's batches, and puts (lines, its end time) on `done`."""
    torch.set_num_threads(1)
    detector = Detector.load(model_dir, device="cpu", max_streams=64)
    for stream, lines in prefill.items():
        detector.engine.score({stream: lines})
    barrier.wait()
    for start in range(0, len(records), LINE_BATCH):
        detector.score(records[start : start + LINE_BATCH])
    done.put((len(records), time.perf_counter()))


def deal_streams(records: list[LogRecord], workers: int) -> dict[str, int]:
    """Stream -> worker, the busiest stream first to the worker with the fewest lines so far."""
    lines = Counter(r.stream for r in records)
    load = [0] * workers
    owner = {}
    for stream, n in sorted(lines.items(), key=lambda item: (-item[1], item[0])):
        owner[stream] = load.index(min(load))
        load[owner[stream]] += n
    return owner


def run_workers(model_dir: str, prefill: Batch, records: list[LogRecord], workers: int) -> dict:
    """`workers` processes at once, each with the streams `deal_streams` gives it: (all their
    lines / the time from the barrier until the last one is done, lines per worker)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with torch's threads
    barrier, done = context.Barrier(workers + 1), context.Queue()
    owner = deal_streams(records, workers)  # a stream with no timed lines fills no ring
    processes = [
        context.Process(
            target=score_in_worker,
            args=(
                model_dir,
                {s: lines for s, lines in prefill.items() if owner.get(s) == k},
                [r for r in records if owner[r.stream] == k],
                barrier,
                done,
            ),
        )
        for k in range(workers)
    ]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    results = [done.get() for _ in processes]
    for process in processes:
        process.join()
    seconds = max(end for _, end in results) - started
    return {
        "workers": workers,
        "lines_per_second": round(len(records) / seconds, 1),
        "lines_per_worker": sorted(n for n, _ in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=1000, help="timed lines, after the rings are full")
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated, of {list(LEVERS)}")
    parser.add_argument("--roofline-seconds", type=float, default=1.0)
    parser.add_argument(
        "--merge-across-words", action="store_true", help="the tokenizer's merges cross spaces (fewer tokens)"
    )
    parser.add_argument(
        "--one-stream",
        action="store_true",
        help="every line in one stream, as `replay FILE` without --stream-key",
    )
    parser.add_argument(
        "--skewed", action="store_true", help="the i-th stream keeps 1/(i + 1) of its timed lines"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="then N Detectors at once, one process and thread each"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    samples: list[Roofline] = [measure(args.roofline_seconds)]  # and again after each repetition
    default_threads = torch.get_num_threads()

    baseline = generate_lines(2000, seed=1, web_hosts=args.hosts)
    trained = train(
        streams_from_lines(baseline.lines, STREAM_KEY),
        TrainConfig(
            preset=args.preset,
            window=args.window,
            fit_window=False,
            max_steps=20,
            batch_size=4,
            merge_across_words=args.merge_across_words,
        ),
    )
    meta, tokenizer = trained.meta, trained.tokenizer
    detector = Detector(trained.model, tokenizer, meta, device="cpu", max_streams=64)
    sink_ids = prompt_ids(tokenizer, meta["pattern_prompt"], meta["sink_tokens"])
    # enough earlier lines that every stream's ring is full (however few tokens a line
    # has), then the timed lines
    fewest_tokens = min(
        map(len, tokenizer.encode_lines([detector.normalizer.mask(x) for x in baseline.lines]))
    )
    per_stream_lines = -(-args.window // fewest_tokens)
    log = generate_lines(args.lines + per_stream_lines * (args.hosts + 8), seed=2, web_hosts=args.hosts)
    records = parse_lines(log.lines, None if args.one_stream else STREAM_KEY)
    ids = tokenizer.encode_lines([detector.normalizer.mask(r.line) for r in records])
    split = len(records) - args.lines
    prefill: Batch = defaultdict(list)
    for record, line in zip(records[:split], ids[:split], strict=True):
        prefill[record.stream].append(line)
    prefill = {s: lines[-per_stream_lines:] for s, lines in prefill.items()}  # >= L tokens each
    timed_records, timed_ids = records[split:], ids[split:]
    if args.skewed:
        timed_records, timed_ids = skewed(timed_records, timed_ids)
    batches = by_stream(timed_records, timed_ids)
    line_count, tokens = len(timed_records), sum(map(len, timed_ids))

    names = args.levers.split(",")
    engines: dict[str, StreamingEngine] = {}
    compile_seconds: dict[str, float] = {}  # the untimed first run of a compiled lever
    best: dict[str, float] = {}
    results: dict[str, tuple[dict[str, list[np.ndarray]], Counted]] = {}
    for _ in range(args.reps):
        for name in names:
            lever = LEVERS[name]
            torch.set_num_threads(lever.threads or default_threads)
            if name not in engines:
                engine = StreamingEngine(
                    copy.deepcopy(trained.model), sink_ids, window=args.window, max_streams=64,
                    chunk_tokens=lever.chunk_tokens, device="cpu", dtype=lever.dtype, int8_ring=lever.int8_ring,
                    step_chunks=lever.step_chunks, step_rows=lever.step_rows,
                )  # fmt: skip
                if lever.compile:
                    engine.step_fn = torch.compile(engine.device_step, dynamic=False)
                    started = time.perf_counter()
                    run_lever(engine, prefill, batches, lever.reference)  # compiles every step shape
                    compile_seconds[name] = round(time.perf_counter() - started, 1)
                engines[name] = engine
            seconds, nll, counted = run_lever(engines[name], prefill, batches, lever.reference)
            best[name] = min(best.get(name, seconds), seconds)
            results[name] = nll, counted
        torch.set_num_threads(default_threads)
        samples.append(measure(args.roofline_seconds))
    roof = highest(samples)
    os.environ.pop(FORCE_REFERENCE_ENV, None)

    rows = []
    want = results[names[0]][0]
    for name in names:
        nll, counted = results[name]
        seconds = best[name]
        token_drift, line_drift = drift(nll, want)
        shares = roof.fraction(counted.flops / seconds, counted.bytes / seconds, LEVERS[name].dtype)
        rows.append({
            "lever": name,
            "lines_per_second": round(line_count / seconds, 1),
            "tokens_per_second": round(tokens / seconds, 1),
            "gflops": round(counted.flops / seconds / 1e9, 2),
            "flops_share": round(shares["flops_share"], 3),
            "gbytes_per_second": round(counted.bytes / seconds / 1e9, 2),
            "bytes_share": round(shares["bytes_share"], 3),
            "max_token_drift": float(f"{token_drift:.2e}"),
            "max_line_drift": float(f"{line_drift:.2e}"),
            "warmup_seconds": compile_seconds.get(name, 0.0),  # compiling, with one untimed run
        })  # fmt: skip

    # The default Detector end to end on the same lines (a fresh one per repetition, the
    # fastest kept): its device steps' share of the time, and the host's time per line.
    seconds, step_seconds = math.inf, 0.0
    for _ in range(args.reps):
        detector = Detector(copy.deepcopy(trained.model), tokenizer, meta, device="cpu", max_streams=64)
        for stream, lines in prefill.items():  # the same full rings
            detector.engine.score({stream: lines})
        timed = detector.engine.step_fn = Timed(detector.engine.device_step)
        started = time.perf_counter()
        for start in range(0, line_count, LINE_BATCH):
            detector.score(timed_records[start : start + LINE_BATCH])
        elapsed = time.perf_counter() - started
        if elapsed < seconds:
            seconds, step_seconds = elapsed, timed.seconds
    workers = None
    if args.workers:
        with tempfile.TemporaryDirectory() as model_dir:
            save_model_dir(Path(model_dir), trained.model, tokenizer, meta)
            workers = max(
                (run_workers(model_dir, prefill, timed_records, args.workers) for _ in range(args.reps)),
                key=lambda run: run["lines_per_second"],
            )

    fp32 = [s.fp32_flops / 1e9 for s in samples]
    print(
        f"roofline: fp32 GEMM {max(fp32):.1f} GFLOP/s, the highest of {len(fp32)} samples ({min(fp32):.1f}-{max(fp32):.1f})"
    )
    print(
        f"{'lever':<20} {'lines/s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'%flops':>7} {'GB/s':>6} {'%bw':>6} {'drift':>9}"
    )
    for r in rows:
        print(
            f"{r['lever']:<20} {r['lines_per_second']:>9} {r['tokens_per_second']:>9} {r['gflops']:>8} "
            f"{r['flops_share']:>7.1%} {r['gbytes_per_second']:>6} {r['bytes_share']:>6.1%} {r['max_token_drift']:>9}"
        )
    result = {
        "preset": args.preset,
        "window": args.window,
        "sinks": len(sink_ids),
        "streams": len({r.stream for r in timed_records}),
        "lines": line_count,
        "skewed": args.skewed,
        "tokens": tokens,
        "tokens_per_line": round(tokens / line_count, 1),
        "flops_per_token_full_ring": engine_flops_per_token(trained.model.config, len(sink_ids), args.window),
        "roofline": {  # the highest of the samples; the fp32 samples in the order taken
            "fp32_gflops": round(roof.fp32_flops / 1e9, 1),
            "bf16_gflops": round(roof.bf16_flops / 1e9, 1),
            "gbytes_per_second": round(roof.bytes_per_second / 1e9, 1),
            "fp32_gflops_samples": [round(s.fp32_flops / 1e9, 1) for s in samples],
        },
        "levers": rows,
        "detector": {
            "lines_per_second": round(line_count / seconds, 1),
            "device_step_share": round(step_seconds / seconds, 3),
            "host_us_per_line": round(1e6 * (seconds - step_seconds) / line_count, 1),
        },
        "workers": workers,
        "cache_bytes_per_stream": detector.engine.bytes_per_stream,
        "torch_threads": default_threads,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(f"Detector end to end: {result['detector']['lines_per_second']} lines/s")
    if workers:
        print(
            f"{workers['workers']} Detectors, one thread each: {workers['lines_per_second']} lines/s together"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
