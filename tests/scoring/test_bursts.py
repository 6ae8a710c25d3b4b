"""Burst evidence: the binomial tail, the per-stream counter, its calibration and the
combination with the words' evidence."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from logstream.scoring.bursts import HORIZON, BurstCounter, binomial_tail, burst_evidence
from logstream.scoring.calibration import Calibration, HeldOut, fisher, fit_heldout
from logstream.scoring.config import ScoringConfig
from logstream.scoring.gpd import fit_tail, reference_sample

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
    evidence = burst_evidence(["a"] * (HORIZON + 10), WINDOW)
    assert all(x is None for x in evidence[: HORIZON - 1])
    assert all(x is not None for x in evidence[HORIZON - 1 :])


def test_a_burst_stands_out_of_a_steady_stream() -> None:
    """A template new to the stream, 12 times in a row after 500 steady lines, climbs with each
    copy to far beyond anything the steady lines reach."""
    lines = steady(500, seed=2)
    counter = BurstCounter(WINDOW)
    normal = [x for x in [counter.observe(t) for t in lines][HORIZON:] if x is not None]
    first, *burst = [counter.observe("new") for _ in range(12)]
    assert first is None  # no other line of it yet: nothing to test
    assert burst == sorted(burst) and burst[-1] > 10
    assert burst[3] > max(normal)  # five copies already


def test_streams_count_apart() -> None:
    """Two counters do not share counts: the burst is one stream's."""
    one, other = BurstCounter(WINDOW), BurstCounter(WINDOW)
    for t in steady(HORIZON, seed=3):
        one.observe(t)
        other.observe(t)
    for _ in range(8):
        one.observe("new")
    assert one.observe("new") > 5
    assert other.observe("new") is None


def test_a_line_is_not_evidence_of_its_own_burst() -> None:
    """A template's first line in the stream has no burst to test (its rarity is the words'
    to say: counting it here too would count it twice); its second, right after, has one."""
    counter = BurstCounter(WINDOW)
    for t in steady(HORIZON, seed=14):
        counter.observe(t)
    assert counter.observe("new") is None
    assert counter.observe("new") == pytest.approx(-math.log10((WINDOW - 1) / (HORIZON - 1)))


@pytest.mark.parametrize("templates", [12, 200])
def test_on_a_steady_stream_the_evidence_is_a_p_value(templates: int) -> None:
    """Templates at fixed rates: no more than 10**-t of the lines have evidence t or more (a
    line with no burst to test has none: 0). A statistic that counted the line itself in its
    window would put 66% of the lines of a stream of 200 templates at 0.5 or more, not 32%."""
    evidence = burst_evidence(steady(50_000, seed=15, templates=templates), WINDOW)
    evidence = np.array([x or 0.0 for x in evidence[HORIZON - 1 :]])
    for t in (0.5, 1.0, 1.5, 2.0, 3.0):
        assert np.mean(evidence >= t) <= 10**-t, t


def test_fisher_is_calibrated_for_independent_tests() -> None:
    """Two independent p-values combine to a p-value: normal lines pass -log10(rate) at about
    `rate`, and evidence only adds (one strong test still counts, less the combination's cost)."""
    rng = np.random.default_rng(4)
    a, b = -np.log10(rng.uniform(size=200_000)), -np.log10(rng.uniform(size=200_000))
    combined = np.array([fisher(x, y) for x, y in zip(a, b, strict=True)])
    for rate in (0.1, 0.01, 0.001):
        assert combined[combined > -math.log10(rate)].size / combined.size == pytest.approx(rate, rel=0.15)
    assert fisher(3.0, 2.0) > fisher(3.0, 0.0) > 3.0 - 1.0


def test_a_held_out_tail_counts_after_the_lines_its_stream_wrote_before() -> None:
    """A held-out tail continues its stream's training lines, so its bursts count from its first
    line; a baseline of many hosts, each holding out fewer lines than a horizon, then has a
    burst tail, where without the lines before it would have none (and score words alone)."""
    assert any(
        x is not None for x in burst_evidence(steady(10, seed=11), WINDOW, before=steady(HORIZON, seed=12))
    )
    assert all(x is None for x in burst_evidence(steady(10, seed=11), WINDOW))
    rng = np.random.default_rng(13)
    hosts = [
        HeldOut(
            rng.exponential(size=50).tolist(),
            steady(50, seed=s),
            [None] * 50,
            before=steady(HORIZON, seed=100 + s),
        )
        for s in range(8)
    ]
    assert fit_heldout(ScoringConfig(burst_window=WINDOW), hosts).burst is not None
    alone = [replace(h, before=[]) for h in hosts]
    assert fit_heldout(ScoringConfig(burst_window=WINDOW), alone).burst is None


# A multi-host baseline's held-out burst evidence, as one synthetic model's held out: few
# values (a count in a window), the top one shared by 47 of 297 lines
STEPS = {0.1843: 7, 0.1899: 4, 0.2082: 45, 0.2584: 73, 0.2656: 45, 0.2729: 7, 0.2881: 21, 0.296: 2,
         0.3041: 21, 0.3102: 24, 0.3318: 47, 0.5594: 1}  # fmt: skip


def test_a_step_many_normal_lines_share_scores_as_common_as_it_is() -> None:
    """The burst evidence is discrete: a continuous tail fitted over its steps puts the top
    step, which 16% of the held-out lines reach, past -log10(0.05). The burst score is never
    past the held-out share at or above the evidence, so no more than 10**-t of the held-out
    lines score above t; nor past the evidence, its p-value at a steady rate."""
    evidence = [x for x, k in STEPS.items() for _ in range(k)]
    fit, reference = fit_tail(evidence), reference_sample(evidence)
    calibration = Calibration(burst=fit, burst_reference=reference)
    tail = np.array([fit.score(x) for x in evidence])
    scores = np.array([calibration.burst_score(x) for x in evidence])
    assert np.mean(tail > 1.3) > 0.1  # the fit alone: 16% of normal lines past p = 0.05
    for t in (0.3, 0.7, 1.0, 1.3, 2.0, 3.0):
        assert np.mean(scores > t) <= 10**-t, t
    # past every held-out line, the tail, but never past the evidence itself: the fit alone
    # would call evidence 5 (once in 10**5 at a steady rate) once in 10**384
    assert fit.score(5.0) > 100
    assert calibration.burst_score(5.0) == 5.0
    assert all(calibration.burst_score(x) <= x for x in np.linspace(0.0, 10.0, 101))


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
    assert loaded.burst_reference == calibration.burst_reference != []
    assert loaded.config.burst_window == 8
    old = calibration.to_json()
    del old["burst"], old["burst_reference"], old["config"]["burst_window"]
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
