"""Burst evidence: the binomial tail, the per-stream counter, its calibration and the
combination with the words' evidence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logstream.scoring.bursts import HORIZON, BurstCounter, binomial_tail, burst_evidence
from logstream.scoring.calibration import Calibration, HeldOut, fisher, fit_heldout
from logstream.scoring.config import ScoringConfig

WINDOW = 16


@pytest.mark.parametrize(
    ("k", "n", "p"), [(1, 5, 0.5), (3, 10, 0.1), (12, 200, 1 / 16), (20, 20, 1 / 16), (50, 128, 1 / 8)]
)
def test_binomial_tail_is_the_exact_sum(k: int, n: int, p: float) -> None:
    exact = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
    assert binomial_tail(k, n, p) == pytest.approx(-math.log10(exact), rel=1e-9)


def test_binomial_tail_edges() -> None:
    assert binomial_tail(0, 10, 0.1) == 0.0
    assert binomial_tail(11, 10, 0.1) == math.inf


def steady(n: int, seed: int, templates: int = 12) -> list[int]:
    """Templates drawn independently at fixed (Zipf-like) rates: a stream with no burst."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, templates + 1)
    return rng.choice(templates, size=n, p=weights / weights.sum()).tolist()


def test_no_evidence_until_a_whole_horizon() -> None:
    evidence = burst_evidence(steady(HORIZON + 10, seed=1), WINDOW)
    assert all(x is None for x in evidence[: HORIZON - 1])
    assert all(x is not None for x in evidence[HORIZON - 1 :])


def test_a_burst_stands_out_of_a_steady_stream() -> None:
    """A template new to the stream, 12 times in a row after 500 steady lines, climbs with each
    copy to far beyond anything the steady lines reach."""
    lines = steady(500, seed=2)
    counter = BurstCounter(WINDOW)
    normal = [counter.observe(t) for t in lines][HORIZON:]
    burst = [counter.observe("new") for _ in range(12)]
    assert burst == sorted(burst) and burst[-1] > 10
    assert burst[3] > max(normal)  # four copies already


def test_streams_count_apart() -> None:
    """Two counters do not share counts: the burst is one stream's."""
    one, other = BurstCounter(WINDOW), BurstCounter(WINDOW)
    for t in steady(HORIZON, seed=3):
        one.observe(t)
        other.observe(t)
    assert one.observe("new") > 0.5
    for _ in range(8):
        one.observe("new")
    assert one.observe("new") > other.observe("new") + 5


def test_fisher_is_calibrated_for_independent_tests() -> None:
    """Two independent p-values combine to a p-value: normal lines pass -log10(rate) at about
    `rate`, and evidence only adds (one strong test still counts, less the combination's cost)."""
    rng = np.random.default_rng(4)
    a, b = -np.log10(rng.uniform(size=200_000)), -np.log10(rng.uniform(size=200_000))
    combined = np.array([fisher(x, y) for x, y in zip(a, b, strict=True)])
    for rate in (0.1, 0.01, 0.001):
        assert combined[combined > -math.log10(rate)].size / combined.size == pytest.approx(rate, rel=0.15)
    assert fisher(3.0, 2.0) > fisher(3.0, 0.0) > 3.0 - 1.0


def test_a_calibrated_burst_alerts_where_its_words_do_not() -> None:
    """Fitted on a held-out steady stream, normal lines pass the threshold at about the rate it
    names; a template bursting in fresh lines alerts, each of its lines ordinary in its words."""
    rng = np.random.default_rng(5)
    templates = steady(3000, seed=6)
    heldout = HeldOut(rng.exponential(size=3000).tolist(), templates, [None] * 3000)
    calibration = fit_heldout(ScoringConfig(burst_window=WINDOW), [heldout])
    assert calibration.burst is not None
    fresh = steady(20_000, seed=7)
    surprisal = rng.exponential(size=len(fresh))
    scores = np.array(
        [
            calibration.line_score(x, None, burst=b)
            for x, b in zip(surprisal, burst_evidence(fresh, WINDOW), strict=True)
            if b is not None
        ]
    )
    for rate in (0.1, 0.01):
        share = float(np.mean(scores > -math.log10(rate)))
        assert rate / 2 <= share <= rate * 2, (rate, share)
    counter = BurstCounter(WINDOW)
    for t in fresh[:1000]:
        counter.observe(t)
    ordinary = float(np.median(surprisal))
    bursting = [calibration.line_score(ordinary, None, burst=counter.observe("storm")) for _ in range(10)]
    assert calibration.line_score(ordinary, None) < 1.0
    assert bursting[-1] > 4.0  # an alert at 1e-4, ten ordinary lines in a row


def test_the_burst_tail_survives_the_model_file_and_old_files_load_without_it() -> None:
    rng = np.random.default_rng(8)
    heldout = HeldOut(rng.exponential(size=2000).tolist(), steady(2000, seed=9), [None] * 2000)
    calibration = fit_heldout(ScoringConfig(burst_window=8), [heldout])
    loaded = Calibration.from_json(calibration.to_json())
    assert loaded.burst is not None and loaded.burst.to_json() == calibration.burst.to_json()
    assert loaded.config.burst_window == 8
    old = calibration.to_json()
    del old["burst"], old["config"]["burst_window"]
    assert Calibration.from_json(old).burst is None
    assert Calibration.from_json(old).line_score(2.0, None, burst=50.0) == calibration.line.score(2.0)


def test_sessions_have_no_burst_tail() -> None:
    rng = np.random.default_rng(10)
    sessions = [
        HeldOut(rng.exponential(size=300).tolist(), steady(300, seed=s), [None] * 300, end=1.0)
        for s in range(30)
    ]
    assert fit_heldout(ScoringConfig(), sessions).burst is None


@pytest.mark.parametrize("window", [0, HORIZON, -1])
def test_burst_window_out_of_range_is_refused(window: int) -> None:
    with pytest.raises(ValueError, match="burst_window"):
        ScoringConfig(burst_window=window)
