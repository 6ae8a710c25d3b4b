"""The calibrated unit: tail fits that hit a target false-alarm rate, robust to a few incidents."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from logstream.scoring.calibration import SESSION_OUTLIER_SHARE, fit_calibration, incident_sessions
from logstream.scoring.config import ScoringConfig
from logstream.scoring.gpd import VERDICT_REFIT, OnlineTail, TailFit, fit_tail, reference_sample

# (name, sampler): tails of the kind surprisal has (exponential-like) and a heavier one
TAILS = {
    "exponential": lambda rng, n: 3 + rng.exponential(1.0, n),
    "gamma": lambda rng, n: rng.gamma(3.0, 1.0, n),
    "lognormal": lambda rng, n: rng.lognormal(1.0, 0.4, n),
    "pareto xi=0.3": lambda rng, n: rng.pareto(1 / 0.3, n),
}


def observed_rate(name: str, rate: float) -> float:
    """Fit on 5,000 normal scores; the share of 2M fresh ones above the threshold for `rate`."""
    rng = np.random.default_rng(7)
    fit = fit_tail(TAILS[name](rng, 5000))
    return float(np.mean(TAILS[name](rng, 2_000_000) > fit.raw_threshold(rate)))


# The lognormal's tail converges slowly to its GPD limit: at 1e-4 the fit alerts 2.5x too
# often (docs/quality.md), so it is held to the 1e-3 target only.
@pytest.mark.parametrize(
    ("name", "rate"),
    [(name, rate) for name in TAILS for rate in (1e-3, 1e-4) if (name, rate) != ("lognormal", 1e-4)],
)
def test_threshold_hits_the_target_false_alarm_rate(name: str, rate: float) -> None:
    """The threshold for a false-alarm rate flags at most twice that rate of fresh normal scores.
    A tail lighter than exponential (the gamma's, whose moments fit a bounded shape) is fitted
    exponential, never bounded, so it errs quiet: down to a fifth of the rate at 1e-4."""
    observed = observed_rate(name, rate)
    assert rate / 5 <= observed <= rate * 2, f"{name}: observed {observed:.2e} for target {rate:.0e}"


def test_scores_keep_rising_past_the_largest_sample() -> None:
    """Uniform scores have an end, but the tail is never fitted bounded: past the largest
    sample the score keeps rising with the raw score, with no plateau and no jump, so lines
    beyond every normal one still rank, and adjacent rates' thresholds stay apart."""
    fit = fit_tail(np.random.default_rng(6).uniform(0, 10, 3000))
    assert fit.xi >= 0
    raw = np.linspace(10, 30, 201)
    scores = np.array([fit.score(x) for x in raw])
    assert np.all(np.diff(scores) > 0) and np.all(np.isfinite(scores))
    assert float(np.max(np.diff(scores))) < 0.5  # no cliff: 0.1 nats never moves a score by half an order
    thresholds = [fit.raw_threshold(rate) for rate in (1e-2, 3e-3, 1e-3, 3e-4, 1e-4)]
    assert all(b - a > 0.1 for a, b in itertools.pairwise(thresholds))


def test_score_is_minus_log10_of_the_tail_probability() -> None:
    """score(raw_threshold(q)) == -log10 q, in the body and in the fitted tail alike."""
    fit = fit_tail(np.random.default_rng(1).exponential(1.0, 3000))
    for rate in (0.5, 0.1, 1e-2, 1e-4, 1e-7):
        assert fit.score(fit.raw_threshold(rate)) == pytest.approx(-math.log10(rate), abs=1e-6)


def test_scores_rise_with_the_raw_score() -> None:
    """The unit preserves ranking: a higher raw score never gets a lower calibrated score."""
    fit = fit_tail(np.random.default_rng(2).gamma(2.0, 1.0, 1000))
    raw = np.linspace(-1, 40, 2000)
    scores = np.array([fit.score(x) for x in raw])
    assert np.all(np.diff(scores) >= 0) and scores[0] == 0 and scores[-1] > 10


def test_a_few_incidents_in_the_baseline_do_not_raise_the_threshold() -> None:
    """A handful (0.5%) of held-out scores far out (incidents in the baseline): the threshold
    stays within a factor of 2 of the clean rate, instead of moving past the incidents."""
    rng = np.random.default_rng(3)
    contaminated = np.r_[rng.exponential(1.0, 995), 12 + rng.exponential(1.0, 5)]
    fit = fit_tail(contaminated)
    fresh = rng.exponential(1.0, 2_000_000)
    assert float(np.mean(fresh > fit.raw_threshold(1e-3))) >= 0.5e-3
    assert fit.score(12.0) > 3  # an incident like those in the baseline still alerts


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_session_tail_drops_a_few_percent_of_incident_sessions(seed: int) -> None:
    """4% of held-out sessions are incidents far out (HDFS's contaminated baseline): with the
    session cap (up to 5% dropped) sessions like them alert and the threshold stays within
    4x of the clean rate; with the line cap (0.5%) the tail stretches over them and hides
    them. (The robust scale is overestimated when incidents fill a fifth of the peaks, so
    the rate is looser than the 2x of a clean fit.)"""
    rng = np.random.default_rng(seed)
    contaminated = np.r_[rng.exponential(1.0, 960), 20 + rng.exponential(1.0, 40)]
    fresh = rng.exponential(1.0, 2_000_000)
    session = fit_tail(contaminated, max_outlier_share=SESSION_OUTLIER_SHARE)
    assert 0.25e-3 <= float(np.mean(fresh > session.raw_threshold(1e-3))) <= 4e-3
    assert session.score(20.0) > 3
    assert fit_tail(contaminated).score(20.0) < 3  # the line cap keeps them: why sessions differ


def burst_in_baseline(rng: np.random.Generator, burst_templates: list[int]) -> tuple[np.ndarray, list[int]]:
    """988 held-out scores of 200 normal templates, then 12 far-out lines (15-16 nats) of
    `burst_templates`: (scores, each score's template)."""
    scores = np.r_[rng.exponential(1.0, 988), 15 + rng.uniform(0, 1, 12)]
    return scores, [*rng.integers(0, 200, 988).tolist(), *burst_templates]


def test_a_burst_in_the_baseline_is_one_incident() -> None:
    """12 far-out held-out lines of one template (a burst of alerts, more lines than the 0.5%
    cap) are one event: the tail leaves them out, keeps the clean rate within 2x, and lines
    like them alert. Counted as lines (no templates given), spread over twelve templates (rare
    normal lines), or of a template whose other lines are normal (its rare high ones), they
    are too many for the cap and the tail keeps them."""
    rng = np.random.default_rng(11)
    scores, one = burst_in_baseline(rng, [999] * 12)
    _, twelve = burst_in_baseline(np.random.default_rng(11), list(range(1000, 1012)))
    _, common = burst_in_baseline(np.random.default_rng(11), [7] * 12)
    assert common[:988].count(7) > 0  # template 7 has normal lines too
    burst = fit_tail(scores, events=one)
    assert burst.outliers == 12 and burst.score(15.0) > 3.5
    assert float(np.mean(rng.exponential(1.0, 2_000_000) > burst.raw_threshold(1e-3))) <= 2e-3
    assert fit_tail(scores).score(15.0) < 3.5
    assert fit_tail(scores, events=twelve) == fit_tail(scores) == fit_tail(scores, events=common)


@pytest.mark.parametrize("seed", [12, 13, 14])
def test_bursts_that_fill_two_fifths_of_the_peaks_are_left_out(seed: int) -> None:
    """1,000 held-out lines whose last 80 are ten bursts far out (8% of the sample, 40% of the
    200 peaks: a baseline that ends in incidents, as bluegene-0 of docs/quality.md): outward
    testing finds them far out (a scale from the lower 75% of the peaks took the bursts in
    and saw nothing), and ten bursts are ten incidents, so the tail leaves them out and
    lines like them alert; the threshold stays within 5x of the target rate (stage 2 may
    drop up to the 0.5% cap of normal lines besides, so the 2x of a clean fit does not
    hold). The same lines as singletons are rare normal lines, too many for the cap: the
    tail keeps them."""
    rng = np.random.default_rng(seed)
    scores = np.r_[rng.exponential(1.0, 920), 12 + rng.uniform(0, 3, 80)]
    templates = [*rng.integers(0, 100, 920).tolist(), *np.repeat(range(200, 210), 8).tolist()]
    fit = fit_tail(scores, events=templates)
    assert fit.outliers >= 80 and fit.score(12.0) > 4
    fresh = rng.exponential(1.0, 2_000_000)
    assert 0.25e-3 <= float(np.mean(fresh > fit.raw_threshold(1e-3))) <= 5e-3
    singletons = [*templates[:920], *range(300, 380)]
    assert fit_tail(scores, events=singletons).score(12.0) < 3


def test_a_burst_above_a_plateau_of_tied_normal_scores_is_left_out() -> None:
    """Template logs tie: 22 held-out lines of the rarest normal template at one score, and a
    12-line burst three times as high. The plateau's own mean sets the scale, so the burst
    is far out and left out, and the plateau is kept. (A trimmed mean reads the plateau as
    the low end of an exponential three times as wide, and the burst stays in.)"""
    rng = np.random.default_rng(13)
    scores = np.r_[rng.exponential(0.5, 266), np.full(22, 4.9), 14.5 + rng.uniform(0, 0.2, 12)]
    templates = [*rng.integers(0, 30, 266).tolist(), *[50] * 22, *[60] * 12]
    fit = fit_tail(scores, events=templates)
    assert fit.outliers == 12 and fit.score(14.5) > 4 and fit.score(4.9) < 3
    assert fit_tail(scores).score(14.5) < 3.5  # counted as lines, too many for the cap


def test_a_dropped_burst_stays_out_of_online_refits() -> None:
    """The calibration keeps a burst it dropped as one event out of the reference sample:
    online refits have scores, not templates, and a refit over the burst's 12 lines counts
    lines and takes them back into the tail."""
    rng = np.random.default_rng(11)
    scores, templates = burst_in_baseline(rng, [999] * 12)
    calibration = fit_calibration(ScoringConfig(), [float(s) for s in scores], templates, [])
    assert len(calibration.line_reference) == 988 and calibration.line_score(15.0, None) > 3.5
    recent = rng.exponential(1.0, 500)
    online, with_burst = (
        OnlineTail(calibration.line, reference, refit_every=500)
        for reference in (calibration.line_reference, reference_sample(list(scores)))
    )
    for raw in recent:
        online.observe(float(raw), flagged=False)
        with_burst.observe(float(raw), flagged=False)
    assert online.fit.score(15.0) > 3.5
    assert with_burst.fit.outliers == 0  # the burst back in the tail: its threshold moves 3 nats up
    assert with_burst.fit.raw_threshold(3e-4) > online.fit.raw_threshold(3e-4) + 2


def held_out_session(rng: np.random.Generator) -> list[float]:
    """13 lines' surprisal: most of a known template (0.1 nats), a tenth rarer (0.3-2.5 nats)."""
    surprisal = rng.exponential(0.1, 13)
    rare = rng.random(13) < 0.1
    surprisal[rare] = rng.uniform(0.3, 2.5, rare.sum())
    return [float(s) for s in surprisal]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_incident_sessions_stay_out_of_the_line_tail(seed: int) -> None:
    """4% of held-out sessions hold one incident line (4-10 nats), 0.3% of the lines: the line
    tail's own cap brings them back one by one and stretches over them (a line at 4 nats
    scores under the default threshold of 3.5; HDFS's contaminated baseline alerted on
    nothing so). The session tail of the sessions' worst lines finds exactly those sessions,
    and the line tail fitted without them scores such a line as a clean baseline's does. A
    clean set of sessions loses none."""
    rng = np.random.default_rng(seed)
    sessions = [held_out_session(rng) for _ in range(500)]
    for k in range(0, 500, 25):
        sessions[k][3] = float(rng.uniform(4, 10))
    incidents = incident_sessions([max(s) for s in sessions])
    assert incidents == set(range(0, 500, 25))
    clean = [held_out_session(rng) for _ in range(500)]
    assert incident_sessions([max(s) for s in clean]) == set()

    def line_score(sessions: list[list[float]], raw: float) -> float:
        lines = [x for s in sessions for x in s]
        return fit_calibration(ScoringConfig(), lines, [None] * len(lines), []).line_score(raw, None)

    kept = [s for k, s in enumerate(sessions) if k not in incidents]
    assert line_score(sessions, 4.0) < 3.5 < line_score(kept, 4.0)
    assert line_score(kept, 4.0) == pytest.approx(line_score(clean, 4.0), abs=0.3)


def test_rare_normal_scores_are_kept_not_trimmed() -> None:
    """2% of held-out scores far above a tight cluster are rare normal lines, not incidents:
    the tail keeps them, so lines like them do not alert (trimming them flagged every rare
    normal line of a Thunderbird log)."""
    rng = np.random.default_rng(8)
    scores = np.r_[1.4 + rng.exponential(0.05, 980), 9 + rng.uniform(0, 2, 20)]
    assert fit_tail(scores).score(10.5) < 3


def test_tied_scores_keep_a_usable_tail() -> None:
    """Template logs give many tied scores: the tail neither collapses nor flags the ties.
    Half the peaks tie at the peak threshold: outward testing leaves those zero excesses out,
    as a scale from them would make every peak above a far-out burst of its template."""
    rng = np.random.default_rng(4)
    scores = np.r_[np.full(700, 2.0), np.full(200, 2.5), 2.5 + rng.exponential(0.5, 100)]
    templates = [*[0] * 700, *[1] * 200, *np.repeat(range(2, 12), 10).tolist()]
    for fit in (fit_tail(scores), fit_tail(scores, events=templates)):
        assert fit.outliers == 0
        assert fit.score(2.5) < 1 and fit.score(2.5 + 0.5 * math.log(1e4)) > 3


def test_a_few_scores_above_a_tie_of_nearly_all_peaks_are_far_out() -> None:
    """HDFS's held-out sessions scored without sinks: 97 of the 101 peaks tie, and the 4 above
    them are incident sessions. The tie is the tail, so the session tail drops the 4."""
    rng = np.random.default_rng(5)
    worst = np.r_[rng.uniform(0, 6.0, 406), np.full(98, 6.1), np.full(4, 7.5)]  # u is the tie
    fit = fit_tail(worst, max_outlier_share=SESSION_OUTLIER_SHARE)
    assert fit.outliers == 4 and fit.score(7.5) > 3


def test_too_few_scores_is_a_clear_error() -> None:
    """A calibration set below the minimum is a ValueError naming what is missing."""
    with pytest.raises(ValueError, match="held-out scores"):
        fit_tail([1.0] * 5)


def test_online_refit_follows_drift_but_never_learns_flagged_scores() -> None:
    """DSPOT-style: unflagged scores of a drifted system move the tail; flagged ones never do."""
    rng = np.random.default_rng(5)
    reference = reference_sample(list(rng.exponential(1.0, 1000)))
    drifted = list(2 + rng.exponential(1.0, 3000))
    learns, ignores = (OnlineTail(fit_tail(reference), reference, refit_every=500) for _ in range(2))
    for raw in drifted:
        learns.observe(raw, flagged=False)
        ignores.observe(raw, flagged=True)
    assert learns.fit.raw_threshold(1e-3) > ignores.fit.raw_threshold(1e-3) + 1
    assert ignores.fit == fit_tail(reference)


def test_an_online_refit_follows_drift_but_never_a_heavier_shape() -> None:
    """Recent lines with a tail of rare high scores: the refit's scale grows with them (the
    threshold follows), but its shape stays at the calibration's. A heavier shape, fitted on
    a few hundred lines, extrapolates a 3e-4 threshold far past any line and silences the
    detector."""
    rng = np.random.default_rng(3)
    reference = reference_sample(list(rng.uniform(0, 10, 1000)))
    calibrated = fit_tail(reference)
    recent = np.r_[rng.uniform(0, 10, 900), 10 + rng.exponential(3, 100)]
    rng.shuffle(recent)
    online = OnlineTail(calibrated, reference, refit_every=500)
    for raw in recent:
        online.observe(float(raw), flagged=False)
    assert online.fit.xi <= calibrated.xi
    assert fit_tail([*reference, *recent]).xi > calibrated.xi  # what an unbounded refit would take
    assert online.fit.raw_threshold(1e-3) > calibrated.raw_threshold(1e-3) + 5


@pytest.mark.parametrize("seed", range(6))
def test_refits_on_lines_censored_at_the_threshold_stay_at_the_calibrated_rate(seed: int) -> None:
    """A system that does not change (plain lines, a hump of 10% rare ones), each line flagged
    at 5e-3 by the tail of the moment and, as the detector does, kept out of the refits when
    flagged: 8 refits later at most 1.5% of its lines alert. A refit's largest sample sits just
    under the threshold (the lines above it were flagged); anchoring the fit there as if
    nothing lay above it would pull the threshold down to it, refit after refit (3.5% of the
    lines alert on seed 2; 3.7% instead of 0.2% on the synthetic system of
    tests/evaluation/test_detection.py). So the flagged lines count as scores above it
    (`fit_tail(censored=...)`)."""
    rng = np.random.default_rng(seed)

    def draw(n: int) -> np.ndarray:
        x = 2 + rng.exponential(0.3, n)
        rare = rng.random(n) < 0.1
        x[rare] = 3 + rng.gamma(2.0, 0.8, int(rare.sum()))
        return x

    reference = reference_sample(list(draw(400)))
    online = OnlineTail(fit_tail(reference), reference, refit_every=500)
    flagged = []
    for raw in draw(4000):
        flagged.append(online.fit.score(float(raw)) > -math.log10(5e-3))
        online.observe(float(raw), flagged[-1], 5e-3)
    assert np.mean(flagged[2000:]) <= 0.015


def test_the_fit_is_honest_about_its_largest_sample() -> None:
    """300 bimodal scores (plain lines near 1, a hump of rare ones up to 13): the fit claims at
    most 5/(n+1) beyond the largest sample, so a 1e-3 threshold is not far past anything seen."""
    rng = np.random.default_rng(9)
    scores = np.r_[1 + rng.exponential(0.2, 240), rng.uniform(3, 13, 60)]
    fit = fit_tail(scores)
    assert 10 ** fit.log10_sf(float(scores.max())) <= 5 / (len(scores) + 1)


def test_a_fit_saves_how_many_outliers_it_dropped() -> None:
    """`outliers` (the largest samples dropped as incidents) survives a save."""
    rng = np.random.default_rng(3)
    fit = fit_tail(np.r_[rng.exponential(1.0, 995), 12 + rng.exponential(1.0, 5)])
    assert fit.outliers == 5
    saved = json.loads(json.dumps(fit.to_json()))
    assert TailFit.from_json(saved).to_json() == saved


def test_without_refits_of_unflagged_lines_only_lines_marked_normal_move_the_tail() -> None:
    """`refit_every` 0: a drifted system's unflagged lines leave the tail as it is; the same
    lines marked normal by an operator move it after VERDICT_REFIT of them."""
    rng = np.random.default_rng(12)
    reference = reference_sample(list(rng.exponential(1.0, 1000)))
    drifted = list(4 + rng.exponential(1.0, VERDICT_REFIT))
    unlabelled, vouched = (OnlineTail(fit_tail(reference), reference, refit_every=0) for _ in range(2))
    for raw in drifted:
        unlabelled.observe(raw, flagged=False)
        vouched.observe(raw, flagged=False, normal=True)
    assert unlabelled.fit == fit_tail(reference)
    assert vouched.fit.raw_threshold(1e-3) > unlabelled.fit.raw_threshold(1e-3) + 0.5
