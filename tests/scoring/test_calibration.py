"""One score unit for every model and chunk, and detection from a small raw baseline.

Scores are -log10 P(a normal line scores this high): a threshold means the same false-alarm
rate whatever model, chunk or stream produced the score (docs/quality.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from loghub_support import LOGHUB

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.detector import Detector
from logstream.evaluation.injection import strip_label_column
from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.lifecycle.train import TrainConfig, train

THUNDERBIRD = LOGHUB / "Thunderbird_2k.log"  # its first column labels each line; all are normal


FIXTURE_RATE = 1e-2


@pytest.fixture(scope="module")
def prequential(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict]]:
    """`replay --auto-train all` of a 3,000-line synthetic log with incidents: three chunks, two
    models (the first chunk's scores the first two chunks, its continuation the third). At a
    false-alarm rate of 1e-2, so that the per-chunk counts are not all zero."""
    tmp = tmp_path_factory.mktemp("prequential")
    log = tmp / "incidents.log"
    log.write_text("\n".join(generate_lines(3000, seed=21, incidents=INCIDENT_KINDS).lines) + "\n")
    scores = tmp / "scores.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "replay", str(log), "--auto-train", "all", "--preset", "tiny",
         "--window", "64", "--max-steps", "120", "--false-alarm-rate", str(FIXTURE_RATE),
         "--out", str(scores), "--json"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return summary, [json.loads(line) for line in scores.read_text().splitlines()]


def test_auto_train_all_reports_one_threshold_unit(prequential: tuple[dict, list[dict]]) -> None:
    """Every chunk's model has the same threshold in -log10 p (its raw-score threshold differs),
    and every scored line is judged against it."""
    summary, rows = prequential
    chunks = summary["chunks"]
    asked = round(-np.log10(FIXTURE_RATE), 4)  # the outputs round to 4 places
    assert summary["score_unit"] == "-log10 p" and len(chunks) == 3
    assert {c["threshold"] for c in chunks} == {summary["threshold"]} == {asked}
    assert chunks[0]["raw_threshold"] != chunks[2]["raw_threshold"]  # two models, one unit
    assert {r["threshold"] for r in rows} == {asked}
    assert all(r["anomaly"] == (r["score"] > r["threshold"]) for r in rows)  # no verdicts here


@pytest.fixture(scope="module")
def two_models(synthetic_model_dir: Path) -> list[Detector]:
    """The shared test model and one trained differently (window, seed, data, steps): their raw
    surprisals differ, their calibrated scores should not."""
    other = train(
        streams_from_lines(generate_lines(3000, seed=9).lines, STREAM_KEY),
        TrainConfig(preset="tiny", window=64, seed=2, max_steps=300, batch_size=16),
    )
    return [
        Detector.load(synthetic_model_dir, device="cpu"),
        Detector(other.model, other.tokenizer, other.meta, device="cpu"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.2, 0.05])
def test_two_models_flag_normal_lines_at_the_same_rate(two_models: list[Detector], rate: float) -> None:
    """On the same 2,000 fresh normal lines, each model puts about `rate` of them above the
    score -log10(rate) (within a factor of 2): a threshold means the same for both."""
    lines = generate_lines(2000, seed=31).lines
    for detector in two_models:
        detector.reset()
        scored = detector.score(parse_lines(lines, STREAM_KEY))
        share = float(np.mean([s.score > -np.log10(rate) for s in scored]))
        assert rate / 2 <= share <= rate * 2, f"{detector.meta['window']=}: {share:.3f} above p = {rate}"


def test_auto_train_all_reports_each_chunks_anomalies(prequential: tuple[dict, list[dict]]) -> None:
    """Each chunk states how many of its lines alerted (what shows a model that never saw that
    period, docs/quality.md), and the counts are those of the scored lines."""
    summary, rows = prequential
    chunks = summary["chunks"]
    per_chunk = [sum(r["anomaly"] for r in rows if r["chunk"] == k) for k in range(len(chunks))]
    assert [c["anomalies"] for c in chunks] == per_chunk
    assert sum(per_chunk) == summary["anomalies"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not THUNDERBIRD.is_file(), reason=f"shared loghub data not found at {THUNDERBIRD}")
def test_a_clean_real_log_pages_no_critical_with_every_default(tmp_path: Path) -> None:
    """A new user's first backtest, `replay --auto-train all` with every default, of a real log
    with no incident in it (Thunderbird_2k, its label column stripped): what alerts there (a
    node's boot: failure-worded lines new to the model) is a warning, never a critical, which
    stays for a line 100 times past the threshold in its own words and level (a boot's burst of
    new lines is a warning however far its rate goes). The false alarms per 1,000 lines are
    measured in docs/quality.md (benchmarks/quality.py)."""
    lines = THUNDERBIRD.read_text(encoding="utf-8", errors="replace").splitlines()
    log = tmp_path / "clean.log"
    log.write_text("\n".join(strip_label_column(line) for line in lines if line.strip()) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "replay", str(log), "--auto-train", "all", "--json"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["scored"] == 2000 and len(summary["chunks"]) == 2
    assert summary["anomalies"] > 0  # the boot's lines do alert: the check is not vacuous
    assert not any(g["critical"] for g in summary["groups"]), [g for g in summary["groups"] if g["critical"]][
        :3
    ]


def test_online_refits_do_not_depend_on_the_batches(synthetic_model_dir: Path) -> None:
    """The line tail is refitted line by line: the same lines scored in one batch (replay) or
    in batches of 7 (serve's polls) get the same scores and flags, across several refits."""
    log = generate_lines(700, seed=4, incidents=INCIDENT_KINDS * 2, incident_start=0.2)
    records = parse_lines(log.lines, STREAM_KEY)
    one, many = (Detector.load(synthetic_model_dir, device="cpu") for _ in range(2))
    for detector in (one, many):
        calibration = detector.calibration
        detector.calibration = replace(calibration, config=replace(calibration.config, refit_every=100))
    first_fit = one.scorer.online.fit
    whole = one.score(records)
    batched = [line for start in range(0, len(records), 7) for line in many.score(records[start : start + 7])]
    assert one.scorer.online.fit != first_fit  # the tail was refitted on the way
    assert [a.is_anomaly for a in whole] == [b.is_anomaly for b in batched]
    assert max(abs(a.score - b.score) for a, b in zip(whole, batched, strict=True)) < 1e-3
