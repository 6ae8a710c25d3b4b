"""What a lower-precision ring changes in the scores: lines and sessions that change side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ring_precision.py [--model runs/hdfs/model]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ring_precision.py --model DIR --log FILE

A trained model (`benchmarks/quality.py` writes HDFS's under runs/quality/HDFS/) scores the same lines
with its fp32 ring and with each lower-precision variant, with the calibration saved with the
model, as serve would use it: the int8 ring (`Detector(int8_ring=True)`: K/V as int8 with one
fp32 scale per token and kv head) and bf16 weights and cache. Input: the held-out 20% of the
HDFS sessions (each session one stream), or with `--log` one
raw log file as one stream (its ring fills and wraps). Prints, per variant, the largest
|score| and |surprisal| change, the share of lines whose flag changes at the model's
threshold (the target: at most 1%) and, for sessions, the share of sessions whose flag
changes. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from logstream.consumers.inputs import InputStats, read_sessions, streams_from_sessions
from logstream.detector import Detector
from logstream.records import Stream

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hdfs" / "train_sessions.jsonl"
# name -> Detector options; the first is the reference
VARIANTS: dict[str, dict[str, object]] = {
    "fp32": {},
    "int8 ring": {"int8_ring": True},
    "bf16 weights and cache": {"dtype": torch.bfloat16},
}


def score(detector: Detector, streams: list[Stream]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(line scores, line surprisals, line flags, session flags), in input order."""
    scores, surprisal, flagged, sessions = [], [], [], []
    group = detector.engine.max_streams  # sessions scored together, as calibration scores them
    for start in range(0, len(streams), group):
        for session in detector.score_streams(streams[start : start + group]):
            scores += [s.score for s in session.lines]
            surprisal += [s.surprisal for s in session.lines]
            flagged += [s.is_anomaly for s in session.lines]
            sessions.append(session.score > detector.threshold)
    return np.array(scores), np.array(surprisal), np.array(flagged), np.array(sessions)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("runs/hdfs/model"))
    parser.add_argument(
        "--data", type=Path, default=DATA, help="HDFS sessions (JSONL); the last 20%% are scored"
    )
    parser.add_argument("--log", type=Path, help="score this raw log as one stream instead")
    args = parser.parse_args()

    if args.log is not None:
        lines = [line for line in args.log.read_text(encoding="utf-8", errors="replace").splitlines() if line]
        streams = [Stream(args.log.name, lines, ended=False)]
    else:
        sessions = read_sessions(args.data, InputStats())
        streams = streams_from_sessions(sessions[int(len(sessions) * 0.8) :])
    results: dict[str, dict[str, float]] = {}
    reference = None
    for name, options in VARIANTS.items():
        detector = Detector.load(args.model, device="cpu", **options)
        started = time.perf_counter()
        got = score(detector, streams)
        seconds = time.perf_counter() - started
        reference = reference or got
        scores, surprisal, flagged, sessions = got
        row = {
            "lines": len(scores),
            "lines_per_second": round(len(scores) / seconds, 1),
            "max_score_change": float(f"{np.abs(scores - reference[0]).max():.2e}"),
            "max_surprisal_change": float(f"{np.abs(surprisal - reference[1]).max():.2e}"),
            "lines_flagged": int(flagged.sum()),
            "lines_changing_side": int((flagged != reference[2]).sum()),
            "share_changing_side": round(float((flagged != reference[2]).mean()), 5),
        }
        if args.log is None:
            row |= {
                "sessions_changing_side": int((sessions != reference[3]).sum()),
                "sessions": len(sessions),
            }
        results[name] = row
        print(f"{name:24s} " + "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
