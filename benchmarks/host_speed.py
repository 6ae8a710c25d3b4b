"""Host costs per line: what replay and serve spend outside the engine, piece by piece.

    .venv/bin/python benchmarks/host_speed.py [--logs ../shared/data/loghub] [--repeat 3]

Reads every `*.log` in `--logs` (default: the 15 loghub samples, 30,000 lines of 15 formats)
as one file, and times each piece of a line's host work in microseconds per line, best of
`--repeat` (the machine is shared):
- reading and parsing the file as replay does (serve's parser, one `default` stream), then
  the same with each line's event time (`event_time.with_event_time`);
- the line's level (`ScoringConfig.level`: its level field and failure words);
- masking (`Normalizer.mask`), tokenizing in replay's batches (`LineTokenizer.encode_lines`),
  template mining (`PatternMiner.add`), which tokens begin a word: each with a fresh
  tokenizer or miner, as a replay starts, so that their caches fill as the file goes;
- per alert: its explanation, token offsets (a second tokenizer call) plus `explain_line`,
  with made-up token surprisals (the cost does not depend on them).
The tokenizer is trained on the masked lines (`tiny`'s vocabulary). The engine is timed by
`cpu_speed.py`. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from logstream.consumers.file import read_file
from logstream.consumers.inputs import InputStats, line_parser
from logstream.engine.presets import PRESETS
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.replay import LINE_BATCH
from logstream.scoring.config import ScoringConfig
from logstream.text.event_time import with_event_time
from logstream.text.explain import explain_line, line_token_offsets
from logstream.text.normalize import Normalizer
from logstream.text.patterns import PatternMiner

LOGHUB = Path("../shared/data/loghub")


def best_us_per_line(work: Callable[[], object], lines: int, repeat: int) -> float:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return round(1e6 * min(seconds) / lines, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--logs", type=Path, default=LOGHUB, help="a folder of *.log files")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    files = sorted(args.logs.glob("*.log"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "all.log"
        path.write_bytes(b"".join(p.read_bytes() for p in files))
        record_parser = line_parser(None)
        records = list(read_file(path, record_parser, InputStats()))
        n = len(records)
        costs = {
            "read_and_parse": best_us_per_line(
                lambda: sum(1 for _ in read_file(path, record_parser, InputStats())), n, args.repeat
            ),
            "read_parse_and_event_time": best_us_per_line(
                lambda: sum(1 for _ in with_event_time(read_file(path, record_parser, InputStats()))),
                n,
                args.repeat,
            ),
        }
    normalizer = Normalizer()
    lines = [r.line for r in records]
    masked = [normalizer.mask(line) for line in lines]
    hf = train_tokenizer(masked, PRESETS["tiny"].vocab_size)
    tokenizer = LineTokenizer(hf)
    ids = tokenizer.encode_lines(masked)
    scoring = ScoringConfig()
    costs["level"] = best_us_per_line(lambda: [scoring.level(line) for line in lines], n, args.repeat)
    costs["mask"] = best_us_per_line(lambda: [normalizer.mask(line) for line in lines], n, args.repeat)

    def tokenize() -> None:  # a fresh tokenizer, its cache empty, as a replay starts
        fresh = LineTokenizer(hf)
        for i in range(0, n, LINE_BATCH):
            fresh.encode_lines(masked[i : i + LINE_BATCH])

    def word_starts() -> None:
        fresh = LineTokenizer(hf)
        for line_ids in ids:
            fresh.word_starts(line_ids)

    def mine() -> None:
        miner = PatternMiner()
        for line in masked:
            miner.add(line)

    costs["tokenize"] = best_us_per_line(tokenize, n, args.repeat)
    costs["mine_templates"] = best_us_per_line(mine, n, args.repeat)
    costs["word_starts"] = best_us_per_line(word_starts, n, args.repeat)
    rng = np.random.default_rng(0)
    nll = [rng.exponential(3.0, len(x)).astype(np.float32) for x in ids]
    costs["explain_alert"] = best_us_per_line(
        lambda: [
            explain_line(line, normalizer.rules, m, line_token_offsets(tokenizer, m), token_nll)
            for line, m, token_nll in zip(lines, masked, nll, strict=True)
        ],
        n, args.repeat,
    )  # fmt: skip
    for name, us in costs.items():
        print(f"{name:<28} {us:>8} us/line")
    print(json.dumps({"lines": n, "files": len(files), "us_per_line": costs}))


if __name__ == "__main__":
    main()
