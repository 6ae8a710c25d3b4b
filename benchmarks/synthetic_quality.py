"""Which line score catches the synthetic incidents? Mean of all words or tokens vs the top k.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/synthetic_quality.py [--steps 600]

Trains the tiny preset (window 128) on 4,000 clean synthetic lines, then scores 1,500 held-out
normal lines (for the threshold: their 0.995 quantile, no labels) and a 1,500-line log with
three incidents of each kind. For each line score it prints how many incident lines of each
kind cross the threshold and how many normal lines do. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import numpy as np

from logstream.detector import Detector, line_evidence
from logstream.inputs import parse_lines, streams_from_lines
from logstream.scoring import LINE_UNITS
from logstream.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.train import TrainConfig, train


def token_nll(detector: Detector, lines: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-line token surprisal and word starts, every stream starting fresh."""
    records = parse_lines(lines, STREAM_KEY)
    _, ids, surprisal = detector.token_surprisal(records)
    for stream in {r.stream for r in records}:
        detector.engine.drop(stream)
    return surprisal, [detector.tokenizer.word_starts(line_ids) for line_ids in ids]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    streams = streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY)
    trained = train(
        streams, TrainConfig(preset="tiny", window=128, epochs=100, max_steps=args.steps, batch_size=16)
    )
    detector = Detector(trained.model, trained.tokenizer, trained.meta, device="cpu")
    normal = generate_lines(1500, seed=3)
    test = generate_lines(1500, seed=7, incidents=INCIDENT_KINDS * 3)
    normal_nll, test_nll = token_nll(detector, normal.lines), token_nll(detector, test.lines)
    labels = np.array(test.labels)
    results = {}
    for unit, top_k in itertools.product(LINE_UNITS, (0, 1, 2, 3, 4)):
        # raw scores (nats + the model's own severity priors; no tails, no novelty): top-k varies
        config = dataclasses.replace(detector.scoring, line_top_k=top_k, line_unit=unit, capped_top_k=0)
        calibration = dataclasses.replace(detector.calibration, config=config)

        def scores(
            nll: tuple[list[np.ndarray], list[np.ndarray]], lines: list[str], calibration=calibration
        ) -> np.ndarray:
            return np.array(
                [
                    line_evidence(calibration, x, line, word_starts=words).raw
                    for x, words, line in zip(*nll, lines, strict=True)
                ]
            )

        threshold = float(np.quantile(scores(normal_nll, normal.lines), 0.995))
        test_scores = scores(test_nll, test.lines)
        caught = {
            kind: f"{int((test_scores[[i for i, k in enumerate(test.kinds) if k == kind]] > threshold).sum())}"
            f"/{test.kinds.count(kind)}"
            for kind in INCIDENT_KINDS
        }
        false_alarms = int(((test_scores > threshold) & (labels == 0)).sum())
        name = f"mean of all {unit}s" if top_k == 0 else f"mean of top-{top_k} {unit}s"
        results[name] = {
            "caught": caught,
            "false_alarms": false_alarms,
            "normal_lines": int((labels == 0).sum()),
        }
        print(f"{name:22s} {caught} false alarms {false_alarms}/{int((labels == 0).sum())}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
