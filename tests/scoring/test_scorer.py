"""The scorer's stages: evidence, the level prior after calibration, calibration, operator rules.

The stages run on token surprisal given directly (what the model would compute), so each one
is checked on its own; tests/evaluation/test_detection.py runs them behind a trained model.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from logstream.lifecycle.feedback import Feedback, FeedbackRules, FeedbackStore
from logstream.records import LogRecord
from logstream.scoring.calibration import CRITICAL_MARGIN, Calibration, HeldOut, alert_severity, fit_heldout
from logstream.scoring.config import ScoringConfig
from logstream.scoring.evidence import line_surprisal, top_mean, word_units
from logstream.scoring.scorer import Scorer

ROUTINE = "<TS> <HOST> app: request served"
FAILURE = "<TS> <HOST> app: request failed"
NEW = "<TS> <HOST> app: cache rebuilt"


def heldout(rng: np.random.Generator, failures: float = 0.0, n: int = 2000) -> list[HeldOut]:
    """One held-out stream: lines of low surprisal (0-2 nats) and a tail of rare ones; a share
    `failures` of them are error lines as routine as the rest (a baseline full of a failure)."""
    surprisal = rng.exponential(0.5, n)
    levels = ["error" if rng.random() < failures else None for _ in range(n)]
    return [HeldOut([float(x) for x in surprisal], [None] * n, levels)]


def test_a_line_surprisal_counts_each_word_once() -> None:
    """Three rare pieces of one word count once: the top 3 is that word and the two next."""
    nll = np.array([12.0, 11.0, 10.0, 1.0, 2.0, 0.5])
    starts = np.array([True, False, False, True, True, True])
    assert list(word_units(nll, starts)) == [12.0, 1.0, 2.0, 0.5]
    assert line_surprisal(nll, starts, 3) == pytest.approx((12.0 + 2.0 + 1.0) / 3)
    assert line_surprisal(nll, starts, 0) == pytest.approx((12.0 + 1.0 + 2.0 + 0.5) / 4)
    assert line_surprisal(np.array([]), np.array([], dtype=bool), 3) == 0.0


def test_top_mean_is_numpys_mean_of_the_top_k_bit_for_bit() -> None:
    """`top_mean` sorts in Python for speed; its value is numpy's mean of the k largest, largest
    first, in the units' dtype, to the last bit (ties, k beyond the length, float32 and float64)."""
    rng = np.random.default_rng(0)
    for case in range(3000):
        n, k = int(rng.integers(2, 30)), int(rng.choice([0, 1, 3, 6, 40]))
        units = rng.random(n) * rng.choice([0.01, 1.0, 20.0])
        units = np.round(units, 1) if case % 3 == 0 else units  # ties
        units = units.astype(np.float32 if case % 2 else np.float64)
        want = np.mean(np.sort(units)[::-1][:k] if k else units)
        assert top_mean(units, k) == float(want), (units, k)


def test_a_baseline_full_of_a_failure_does_not_calibrate_its_prior_away() -> None:
    """A held-out baseline where 30% of the lines are routine error lines: the tail is of
    surprisal alone, so an error line still scores its prior above a plain line of the same
    surprisal, as it does after a clean baseline."""
    config = ScoringConfig()
    for failures in (0.0, 0.3):
        calibration = fit_heldout(config, heldout(np.random.default_rng(1), failures))
        for surprisal in (0.1, 1.0, 5.0):
            lift = calibration.line_score(surprisal, "error") - calibration.line_score(surprisal, None)
            assert lift == pytest.approx(config.level_prior["error"])


def test_a_critical_alert_is_far_past_the_threshold() -> None:
    """Critical means CRITICAL_MARGIN orders of magnitude past the threshold; anything less
    that alerts is a warning."""
    assert alert_severity(3.5 + CRITICAL_MARGIN, 3.5) == "critical"
    assert alert_severity(3.5 + CRITICAL_MARGIN - 0.01, 3.5) == "warning"


def score_lines(scorer: Scorer, masked: list[str], surprisal: list[float], threshold: float) -> list:
    """One-word lines of the given surprisal, as the model would hand them to the scorer."""
    records = [LogRecord(line=text) for text in masked]
    nll = [np.array([x]) for x in surprisal]
    starts = [np.array([True]) for _ in surprisal]
    return scorer.score(records, masked, nll, starts, threshold)


@pytest.fixture
def store(tmp_path: Path) -> FeedbackStore:
    return FeedbackStore(tmp_path / "outbox.sqlite")


@pytest.mark.parametrize("refit_every", [50, 0])
def test_a_normal_verdict_silences_its_template_and_joins_the_normal_sample(
    store: FeedbackStore, refit_every: int
) -> None:
    """After "normal" on a template, its lines never alert, however surprising, and the online
    tail takes them into its sample (they are normal now): the next refit's threshold moves up
    towards them, and they score orders of magnitude lower, whether the tail also refits on
    unflagged lines (`refit_every` 50) or only on those marked normal (0, a refit every
    VERDICT_REFIT of them). Without the verdict they alert and stay out of the sample."""
    config = ScoringConfig(refit_every=refit_every)
    calibration = fit_heldout(config, heldout(np.random.default_rng(2)))
    threshold = calibration.threshold()
    alerting = [12.0] * 60
    plain = Scorer(calibration, [])
    assert all(line.is_anomaly for line in score_lines(plain, [NEW] * 60, alerting, threshold))
    assert plain.online.fit == calibration.line  # flagged lines never move the tail
    store.add(Feedback("normal", NEW, created_by="ops"))
    ruled = Scorer(calibration, [], FeedbackRules(store, refresh_seconds=0.0))
    lines = score_lines(ruled, [NEW] * 60, alerting, threshold)
    assert not any(line.is_anomaly for line in lines) and lines[0].suppressed
    assert ruled.online.fit.raw_threshold(10**-threshold) > calibration.line.raw_threshold(10**-threshold)
    assert lines[-1].score < lines[0].score - 3  # after the refit, such a line is 1,000x less rare


def test_an_anomaly_verdict_always_alerts_and_stays_out_of_the_sample(store: FeedbackStore) -> None:
    """After "anomaly" on a template, its lines alert however unsurprising, and the online tail
    never sees them; other lines are scored as before."""
    config = ScoringConfig(refit_every=50)
    calibration = fit_heldout(config, heldout(np.random.default_rng(3)))
    threshold = calibration.threshold()
    store.add(Feedback("anomaly", FAILURE, created_by="ops"))
    scorer = Scorer(calibration, [], FeedbackRules(store, refresh_seconds=0.0))
    lines = score_lines(scorer, [FAILURE] * 60 + [ROUTINE] * 2, [0.1] * 62, threshold)
    assert all(line.is_anomaly and line.verdict == "anomaly" for line in lines[:60])
    assert not any(line.is_anomaly for line in lines[60:])
    assert scorer.online.fit == calibration.line  # 60 confirmed lines: never observed, no refit


def test_a_calibration_round_trips_through_json() -> None:
    """What `train` saves is what `Detector` loads: the same scores."""
    calibration = fit_heldout(ScoringConfig(), heldout(np.random.default_rng(4)))
    loaded = Calibration.from_json(calibration.to_json())
    for surprisal, level in ((0.2, None), (3.0, "warning"), (9.0, "critical")):
        assert loaded.line_score(surprisal, level) == pytest.approx(
            calibration.line_score(surprisal, level), abs=1e-4
        )


def test_a_burst_is_counted_in_its_own_stream() -> None:
    """Twelve lines of one template in a row alert in the stream that wrote them, as warnings
    (their words are ordinary); the same lines spread thinly over another stream do not, and a
    closed stream starts counting again."""
    rng = np.random.default_rng(6)
    texts = [" ".join([f"w{i}"] * (i + 1)) for i in range(12)]  # 12 templates: lengths differ
    weights = 1.0 / np.arange(1, 13)

    def steady(n: int) -> list[str]:
        return [texts[i] for i in rng.choice(12, size=n, p=weights / weights.sum())]

    scorer = Scorer(Calibration(), [])
    held = steady(2000)
    ids = [x.template_id for x in score_lines(scorer, held, [0.5] * len(held), 3.0)]
    calibration = fit_heldout(
        ScoringConfig(burst_window=8), [HeldOut(rng.exponential(0.5, 2000).tolist(), ids, [None] * 2000)]
    )
    assert calibration.burst is not None
    threshold = calibration.threshold(1e-3)
    scorer = Scorer(calibration, [])
    storm = " ".join(["storm"] * 20)

    def lines(stream: str, masked: list[str]) -> list:
        records = [LogRecord(line=text, stream=stream) for text in masked]
        nll = [np.array([0.5]) for _ in masked]
        return scorer.score(records, masked, nll, [np.array([True])] * len(masked), threshold)

    lines("a", steady(300))
    burst = lines("a", [storm] * 12)
    assert burst[-1].is_anomaly and burst[-1].burst > threshold and burst[-1].severity == "warning"
    assert not burst[0].is_anomaly  # one line of a new template is no burst
    spread = [
        line for _ in range(12) for line in lines("b", [*steady(40), storm]) if line.record.line == storm
    ]
    assert not any(line.is_anomaly for line in spread)
    scorer.close("a")
    assert lines("a", [storm])[0].burst == 0.0  # no horizon written yet: no rate to compare with


def test_a_template_rare_in_the_system_history_scores_its_rarity() -> None:
    """With the baseline's lines per template (a model trained now saves them), a line of a
    template new to the model, or rare in the baseline, scores its rarity where that is
    stronger than its words, at twice its p-value (it is the second look at how new the line
    is); a common one scores its words at that price. A model saved without the counts, and a
    session model (no burst tail), score the words alone, as before."""
    rng = np.random.default_rng(7)
    held = [HeldOut(rng.exponential(0.5, 2000).tolist(), rng.integers(0, 12, 2000).tolist(), [None] * 2000)]
    calibration = fit_heldout(ScoringConfig(burst_window=8), held)
    assert calibration.burst is not None
    rare, new = "<TS> <HOST> kernel: link down on eth0 after reset", "<TS> <HOST> sshd: accepted key for <*>"
    known, counts = [ROUTINE, rare], [990, 10]
    masked = [ROUTINE, rare, new]
    counted = score_lines(Scorer(calibration, known, None, counts), masked, [1.0] * 3, 3.0)
    plain = score_lines(Scorer(calibration, known), masked, [1.0] * 3, 3.0)
    rarity = [-math.log10(1001 / 1001), -math.log10(11 / 1002), -math.log10(1 / 1003)]
    assert [x.rarity for x in counted] == pytest.approx(rarity)
    for with_counts, words, r in zip(counted, plain, rarity, strict=True):
        assert with_counts.score == pytest.approx(max(max(words.score, r) - math.log10(2), 0.0))
    assert counted[2].score > counted[1].score > plain[1].score > counted[0].score
    assert [x.rarity for x in plain] == [0.0] * 3
    sessions = replace(calibration, burst=None)
    session_lines = score_lines(Scorer(sessions, known, None, counts), masked, [1.0] * 3, 3.0)
    assert [x.rarity for x in session_lines] == [0.0] * 3
