"""Does `logstream replay` run in constant memory? Peak RSS of one replay at each input length.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/replay_memory.py [--sizes 20000 200000]

Trains the tiny preset briefly on 4,000 synthetic lines (cached under --runs; model quality does
not matter here), writes a synthetic log of each size (one stream per host, incidents included),
and runs `logstream replay LOG --model M --json` in a fresh process per size, which reports its own
peak resident set (getrusage ru_maxrss). The goal: peak RSS flat in the input length (at most
1.10x from the smallest to the largest size). The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY


def child(log: Path, model: Path) -> None:
    """In a fresh process: one replay through the CLI, then its peak RSS (bytes) as JSON."""
    from logstream.cli import app

    started = time.perf_counter()
    app(["replay", str(log), "--model", str(model), "--json"], standalone_mode=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    sys.stderr.write(json.dumps({"peak_rss_bytes": peak, "seconds": time.perf_counter() - started}) + "\n")


def model_dir(runs: Path) -> Path:
    from logstream.consumers.inputs import streams_from_lines
    from logstream.evaluation.synth import generate_lines
    from logstream.lifecycle.train import TrainConfig, save, train

    out = runs / "replay-memory-tiny"
    if not (out / "logstream.json").is_file():
        streams = streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY)
        config = TrainConfig(
            preset="tiny", window=128, fit_window=False, max_steps=200, stream_key=STREAM_KEY
        )
        save(train(streams, config), out)
    return out


def measure(size: int, model: Path, work: Path) -> dict[str, float]:
    from logstream.evaluation.synth import generate_lines

    log = work / f"log-{size}.log"
    lines = generate_lines(size, seed=5, incidents=INCIDENT_KINDS * (size // 2000)).lines
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(log), str(model)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"replay of {size} lines failed: {done.stderr[-2000:]}")
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    return {"lines": size, "peak_rss_mib": round(stats["peak_rss_bytes"] / 2**20, 1),
            "seconds": round(stats["seconds"], 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--runs", type=Path, default=Path("runs/bench"))
    parser.add_argument("--child", nargs=2, type=Path, metavar=("LOG", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    model = model_dir(args.runs)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for size in sorted(args.sizes):
            rows.append(measure(size, model, Path(work)))
            print(f"{rows[-1]['lines']:>9,} lines: peak RSS {rows[-1]['peak_rss_mib']:8.1f} MiB, "
                  f"{rows[-1]['seconds']:6.1f} s", flush=True)  # fmt: skip
    ratio = rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
    print(f"peak RSS ratio {rows[-1]['lines']:,} / {rows[0]['lines']:,} lines: {ratio:.3f} (goal <= 1.10)")
    print(json.dumps({"rows": rows, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
