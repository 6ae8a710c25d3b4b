"""HDFS session quality: train on the first 80% of sessions (normal only), replay the last 20%.

    .venv/bin/python benchmarks/hdfs_quality.py [--preset small] [--window 2048] [--out runs/hdfs]
    .venv/bin/python benchmarks/hdfs_quality.py --contaminated --out runs/hdfs-contaminated
    .venv/bin/python benchmarks/hdfs_quality.py --seed 1 --out runs/hdfs-seed1   # another training seed
    .venv/bin/python benchmarks/hdfs_quality.py --merge-across-words --out runs/hdfs-lines  # a line = 1 token

`--contaminated` trains (and calibrates) on *all* training sessions, 4% of them anomalous,
as a user whose baseline holds incidents would: the robust training and tail fit must
keep the F1 within 0.1 of the clean baseline's.

Prints session precision/recall/F1 at the calibrated threshold (chosen without labels), the
ceiling F1 of any detector on this split, and the same with sinks reduced to BOS only and with
no sinks (a plain sliding window). Each variant is calibrated on the held-out normal training
sessions with its own scores. A trained model in --out is reused. The last stdout line is JSON.

The ceiling: sessions are cut short by the sample, so some anomalous test sessions have exactly
the template sequence of a normal training session; no detector can tell those apart. With
perfect precision and every other anomalous session found, F1 = 2R / (1 + R), R = the share of
anomalous test sessions whose sequence is new.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from logstream.detector import Detector
from logstream.inputs import InputStats, read_sessions, streams_from_sessions
from logstream.replay import ReplayInput, ReplayOptions, run_replay
from logstream.scoring import DEFAULT_LINE_TOP_K, SESSION_LINE_TOP_K, ScoringConfig
from logstream.train import TrainConfig, calibrate, heldout_split, save, train

# (sinks, line top_k): the default for sessions (the mean of all words), the default for raw
# lines (the top 3 words), and the sink ablations with the sessions' default.
VARIANTS = (
    ("patterns", SESSION_LINE_TOP_K), ("patterns", DEFAULT_LINE_TOP_K),
    ("bos", SESSION_LINE_TOP_K), ("none", SESSION_LINE_TOP_K),
)  # fmt: skip
DEFAULT_VARIANT = f"sinks=patterns top_k={SESSION_LINE_TOP_K}"  # `train --format sessions`'s line score
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hdfs" / "train_sessions.jsonl"


def print_progress(step: int, steps: int, loss: float) -> None:
    if step % 100 == 0:
        print(f"step {step}/{steps} loss {loss:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("runs/hdfs"))
    parser.add_argument("--contaminated", action="store_true", help="train on all sessions, not only normal")
    parser.add_argument("--seed", type=int, default=0, help="training seed (give each its own --out)")
    parser.add_argument(
        "--merge-across-words", action="store_true", help="the tokenizer's merges cross spaces"
    )
    args = parser.parse_args()

    sessions = read_sessions(args.data, InputStats())
    cut = int(len(sessions) * 0.8)
    train_sessions, test_sessions = sessions[:cut], sessions[cut:]
    normal_sequences = {tuple(s.lines) for s in train_sessions if s.label == 0}
    anomalous = [s for s in test_sessions if s.label == 1]
    novel = sum(tuple(s.lines) not in normal_sequences for s in anomalous)
    recall_ceiling = novel / len(anomalous)
    ceiling = 2 * recall_ceiling / (1 + recall_ceiling)

    model_dir = args.out / "model"
    started = time.time()
    baseline = streams_from_sessions([s for s in train_sessions if args.contaminated or s.label == 0])
    config = TrainConfig(
        preset=args.preset, window=args.window, epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
        merge_across_words=args.merge_across_words, scoring=ScoringConfig(line_top_k=SESSION_LINE_TOP_K),
    )  # fmt: skip
    if not (model_dir / "logstream.json").is_file():
        save(train(baseline, config, progress=print_progress), model_dir)
    train_seconds = time.time() - started

    results = {
        "train_sessions": len(baseline),
        "train_sessions_anomalous": sum(s.label == 1 for s in train_sessions) if args.contaminated else 0,
        "test_sessions": len(test_sessions),
        "test_anomalous": len(anomalous),
        "test_anomalous_novel": novel,
        "ceiling_f1": round(ceiling, 4),
        "train_seconds": round(train_seconds, 1),
    }
    # The same held-out sessions that training calibrated on (contaminated ones too, with
    # --contaminated): each variant is calibrated on them again, never on the test labels.
    _, heldout = heldout_split(baseline, config)
    options = ReplayOptions(input=args.data, format="sessions")
    for sinks, top_k in VARIANTS:
        detector = Detector.load(model_dir, sinks=sinks)
        calibrate(detector, heldout, ScoringConfig(line_top_k=top_k))
        report = run_replay(options, ReplayInput(test_sessions, None, InputStats(), detector))
        summary = report.summary()
        keys = ("precision", "recall", "f1", "best_f1", "auc_roc", "auc_pr", "threshold", "lines_per_second")
        name = f"sinks={sinks} top_k={top_k}"
        results[name] = {k: summary[k] for k in keys} | {
            "share_of_ceiling": round(summary["f1"] / ceiling, 3)
        }
        print(f"{name:22s} F1 {summary['f1']:.3f} (ceiling {ceiling:.3f}, {summary['f1'] / ceiling:.0%}) "
              f"P {summary['precision']:.3f} R {summary['recall']:.3f} AUC-PR {summary['auc_pr']:.3f} "
              f"best F1 {summary['best_f1']:.3f}", flush=True)  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
