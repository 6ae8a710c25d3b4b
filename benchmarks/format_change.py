"""What a deploy that changes log formats costs, and what feedback and retraining win back.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/format_change.py [--steps 1000 --continue-steps 400]

The synthetic system (logstream.evaluation.synth) has 8 templates. The simulated deploy
(`synth.after_format_change`) rewords 3 of them (37.5% of the templates, about 17% of the
lines): the job's fetch and transform steps and the monitor's heartbeat. Then:

1. stale:            the model trained before the deploy scores post-deploy traffic.
2. + feedback:       an operator marks normal the templates that alerted on the first 1,500
                     post-deploy lines (one verdict per template, its first flagged line as
                     the example); scoring obeys the verdicts.
3. continued:        `train --from` the old model on those 1,500 lines plus the feedback
                     examples plus its kept sample of the old data; no feedback rules.
4. continued + fb:   the continued model with the verdicts still in force.
5. refreshed prompt: dynamic sinks, `train --from --prompt-only`: the stale model's weights
                     with the pattern prompt rebuilt from those 1,500 lines and its tails
                     fitted on them again; no verdicts, no training.

Each scores the same 3,000 post-deploy lines with three incidents of each synthetic kind:
false alarms per 10k normal lines, and which incident kinds are still caught (incident lines
over the threshold / incident lines). False-alarm rate 5e-3, as tests/evaluation/test_detection.py.
The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.detector import Detector
from logstream.evaluation.synth import (
    INCIDENT_KINDS,
    STREAM_KEY,
    SyntheticLog,
    after_format_change,
    generate_lines,
)
from logstream.lifecycle.feedback import Feedback, FeedbackRules, FeedbackStore
from logstream.lifecycle.retrain import continue_training, refresh_prompt, write_sample
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.records import LogRecord

RATE = 5e-3


def records(lines: list[str]) -> list[LogRecord]:
    return parse_lines(lines, STREAM_KEY)


def evaluate(detector: Detector, log: SyntheticLog) -> dict[str, object]:
    detector.reset()
    scored = detector.score(records(log.lines))
    normal = [s.is_anomaly for s, label in zip(scored, log.labels, strict=True) if label == 0]
    caught = {
        kind: f"{sum(s.is_anomaly for s, k in zip(scored, log.kinds, strict=True) if k == kind)}"
        f"/{sum(k == kind for k in log.kinds)}"
        for kind in INCIDENT_KINDS
    }
    return {"false_alarms_per_10k": round(1e4 * sum(normal) / len(normal), 1), "caught": caught}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps of the first model")
    parser.add_argument("--continue-steps", type=int, default=400, help="steps of `train --from`")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="format-change-"))
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=args.steps, batch_size=16)
    baseline = streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY)
    old = work / "v1"
    save(train(baseline, config), old)
    write_sample(old, baseline)

    after = after_format_change(generate_lines(1500, seed=21))  # the first day after the deploy, no incidents
    test = after_format_change(generate_lines(3000, seed=22, incidents=INCIDENT_KINDS * 3))
    stale = Detector.load(old, device="cpu", false_alarm_rate=RATE)
    results = {"stale": evaluate(stale, test)}

    stale.reset()
    first_flag: dict[str, str] = {}  # template -> its first flagged line: what on-call marks normal
    for s in stale.score(records(after.lines)):
        if s.is_anomaly and s.template is not None:
            first_flag.setdefault(s.template, s.record.line)
    db = work / "feedback.sqlite"
    store = FeedbackStore(db)
    for template, line in first_flag.items():
        store.add(Feedback("normal", template, line=line, created_by="on-call", comment="deploy 2.4 wording"))
    stale.feedback = FeedbackRules(store)
    results["stale + feedback"] = evaluate(stale, test)

    more = dataclasses.replace(config, max_steps=args.continue_steps)
    trained, _ = continue_training(old, streams_from_lines(after.lines, STREAM_KEY), more, feedback_db=db)
    new = work / "v2"
    save(trained, new)
    continued = Detector.load(new, device="cpu", false_alarm_rate=RATE)
    results["continued"] = evaluate(continued, test)
    continued.feedback = FeedbackRules(store)
    results["continued + feedback"] = evaluate(continued, test)

    prompt = refresh_prompt(old, streams_from_lines(after.lines, STREAM_KEY), config)
    save(prompt, work / "v1-prompt")
    results["refreshed prompt"] = evaluate(
        Detector.load(work / "v1-prompt", device="cpu", false_alarm_rate=RATE), test
    )

    print(f"verdicts given: {len(first_flag)} templates (from {len(after.lines)} post-deploy lines)")
    print(f"{'model':<22} {'false alarms / 10k':>18}  incidents caught (lines)")
    for name, r in results.items():
        print(f"{name:<22} {r['false_alarms_per_10k']:>18}  {r['caught']}")
    print(json.dumps({"verdicts": len(first_flag), "results": results, "meta": {
        "steps": args.steps, "continue_steps": args.continue_steps, "rate": RATE,
        "continued": {k: trained.meta[k] for k in ("new_lines", "feedback_lines", "replayed_lines", "train_steps")},
    }}))  # fmt: skip


if __name__ == "__main__":
    main()
