"""Reproduce the CPU sections of docs/benchmarks.md: the full suite (`suite.py`), then the
constant-cost section over a 1M-line stream.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/streaming.py [--out docs] [--stream-lines 1000000]

Run from the repository root (HDFS is read from ../shared/data). Writes the plots into --out
(the long run's constant-cost plot as bench_constant_cost_1m.png), prints the markdown tables of
both runs, and the JSON of both on the last stdout line. About 15 minutes for the suite and 25 for
the 1M-line stream on one thread of a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from suite import FULL, BenchRun, render, run_bench, with_overrides


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--stream-lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=Path, default=Path("runs/bench"))
    args = parser.parse_args()

    suite = run_bench(BenchRun(config=FULL, runs=args.runs, plots=args.out))
    print(render(suite))
    with tempfile.TemporaryDirectory() as plots:
        long_config = with_overrides(FULL, stream_lines=args.stream_lines)
        long = run_bench(
            BenchRun(config=long_config, sections=("constant",), runs=args.runs, plots=Path(plots))
        )
        (Path(plots) / "bench_constant_cost.png").replace(args.out / "bench_constant_cost_1m.png")
    print(render(long))
    print(json.dumps({"suite": suite, "long_stream": long}))


if __name__ == "__main__":
    main()
