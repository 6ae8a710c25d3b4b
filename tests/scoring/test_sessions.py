"""A session's score: its most surprising stretch of lines at every length, each length
calibrated on held-out sessions (`Calibration.session_score`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from logstream.detector import ScoredSession
from logstream.records import LogRecord
from logstream.scoring.calibration import Calibration, HeldOut, fit_heldout, stretch_highs
from logstream.scoring.config import ScoringConfig
from logstream.scoring.scorer import ScoredLine, session_evidence

THRESHOLD = Calibration().threshold()


def session(rng: np.random.Generator, n: int) -> list[float]:
    """n calls' surprisal: mostly routine (0-2 nats), an exponential tail of rarer ones."""
    return [float(x) for x in rng.exponential(0.5, n)]


def calibration(rng: np.random.Generator) -> Calibration:
    """Fitted on 200 held-out sessions of 100-1,500 lines that each ended as usual."""
    held_out = [
        HeldOut(s, [None] * len(s), [None] * len(s), end=float(rng.exponential(0.5)))
        for s in (session(rng, int(rng.integers(100, 1500))) for _ in range(200))
    ]
    return fit_heldout(ScoringConfig(), held_out)


def scores(fitted: Calibration, surprisal: list[float]) -> list[float]:
    return [fitted.line_score(x, None) for x in surprisal]


def test_stretch_highs_are_the_best_mean_of_each_length() -> None:
    assert stretch_highs([0.0, 4.0, 0.0, 1.0, 1.0], 3) == [2.0, 1.5]  # 8 lines: none so long
    assert stretch_highs([], 2) == []
    assert stretch_highs([1.0, 3.0], 1) == [2.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_short_unusual_stretch_stands_out_in_a_session_of_any_length(seed: int) -> None:
    """Sixteen consecutive calls, each only as rare as 1 in 50 normal ones (none beyond the
    usual worst line of a long session), inside sessions of 200 and 1,400 lines: the stretch
    alerts in both, the same sessions without it do not, and a session scored by its worst
    line alone (the stretch tails removed) misses it."""
    rng = np.random.default_rng(seed)
    fitted = calibration(rng)
    assert len(fitted.stretches) >= 6  # 2 .. 64 lines at least: 100 lines is the shortest held-out
    worst_only = replace(fitted, stretches=[])
    for n in (200, 1400):
        normal = session(rng, n)
        unusual = list(normal)
        start = int(rng.integers(0, n - 16))
        unusual[start : start + 16] = [0.5 * math.log(50)] * 16
        assert fitted.session_score(scores(fitted, normal), None) < THRESHOLD
        assert fitted.session_score(scores(fitted, unusual), None) > THRESHOLD + 1
        assert worst_only.session_score(scores(fitted, unusual), None) < THRESHOLD


def test_normal_sessions_alert_at_about_the_target_rate() -> None:
    """Testing every length costs nothing in false alarms: normal sessions like the held-out
    ones pass the threshold at most at the target rate (a few in 1,000), all lengths together."""
    rng = np.random.default_rng(7)
    fitted = calibration(rng)
    rate = 10**-THRESHOLD
    alerts = sum(
        fitted.session_score(scores(fitted, session(rng, int(rng.integers(100, 1500)))), None) > THRESHOLD
        for _ in range(1000)
    )
    assert alerts <= max(3, 3 * rate * 1000)


def test_the_stretch_tails_survive_the_model_file() -> None:
    rng = np.random.default_rng(3)
    fitted = calibration(rng)
    loaded = Calibration.from_json(fitted.to_json())
    line_scores = scores(fitted, session(rng, 500))
    assert len(loaded.stretches) == len(fitted.stretches) > 0
    assert loaded.session_score(line_scores, 1.0) == pytest.approx(
        fitted.session_score(line_scores, 1.0), abs=1e-4
    )
    older = {k: v for k, v in fitted.to_json().items() if k != "stretches"}  # saved before stretches
    assert Calibration.from_json(older).session_score(line_scores, 1.0) == pytest.approx(
        replace(fitted, stretches=[]).session_score(line_scores, 1.0), abs=1e-4
    )


def line(score: float, verdict: str | None = None) -> ScoredLine:
    return ScoredLine(LogRecord(line="call", stream="s"), score, THRESHOLD, 0.0, verdict=verdict)


def test_a_normal_verdict_takes_its_lines_out_of_a_sessions_evidence() -> None:
    """The unusual stretch marked normal by an operator no longer alerts its session; a line
    confirmed as an anomaly is what the session's alert shows, whatever its score."""
    rng = np.random.default_rng(4)
    fitted = calibration(rng)
    normal = scores(fitted, session(rng, 400))
    stretch = [fitted.line_score(0.5 * math.log(50), None)] * 16
    unmarked = [line(x) for x in [*normal[:200], *stretch, *normal[200:]]]
    marked = (
        [line(x) for x in normal[:200]]
        + [line(x, "normal") for x in stretch]
        + [line(x) for x in normal[200:]]
    )
    assert fitted.session_score(session_evidence(unmarked), None) > THRESHOLD
    assert fitted.session_score(session_evidence(marked), None) < THRESHOLD
    confirmed = line(0.1, "anomaly")
    assert ScoredSession("s", [*unmarked, confirmed], None, 0.0).worst is confirmed
    shown = ScoredSession("s", marked, None, 0.0).worst
    assert shown is not None and shown.verdict is None


@pytest.mark.parametrize("seed", [0, 1])
def test_incident_sessions_of_the_baseline_stay_out_of_the_session_tails(seed: int) -> None:
    """4% of the held-out sessions hold an incident line (8-12 nats; HDFS's contaminated
    baseline): the session tails are fitted on the other 480, as the line tail is, and a
    new session like the incidents alerts while a normal one stays quiet."""
    rng = np.random.default_rng(seed)
    held_out = []
    for k in range(500):
        surprisal = session(rng, int(rng.integers(10, 40)))
        if k % 25 == 0:
            surprisal[3] = float(rng.uniform(8, 12))
        held_out.append(HeldOut(surprisal, [None] * len(surprisal), [None] * len(surprisal), end=1.0))
    fitted = fit_heldout(ScoringConfig(), held_out)
    assert fitted.heldout_sessions == 480
    incident = session(rng, 20)
    incident[5] = 10.0
    assert fitted.session_score(scores(fitted, incident), fitted.end_score(1.0)) > THRESHOLD
    assert fitted.session_score(scores(fitted, session(rng, 20)), fitted.end_score(1.0)) < THRESHOLD


@pytest.mark.parametrize("seed", [0, 1])
def test_sessions_of_the_baseline_that_end_early_stay_out_of_the_tails(seed: int) -> None:
    """2% of the held-out sessions end where a normal one never does (their end NLL 8-9 nats,
    their lines ordinary: HDFS's contaminated baseline holds blocks that stop after two lines).
    They are incidents as much as a far-out line is: the end tail is fitted on the other 490,
    and a new session that ends that way alerts while one that ends as usual stays quiet."""
    rng = np.random.default_rng(seed)
    held_out = []
    for k in range(500):
        surprisal = session(rng, int(rng.integers(10, 40)))
        end = float(rng.uniform(8, 9)) if k % 50 == 0 else float(rng.exponential(0.1))
        held_out.append(HeldOut(surprisal, [None] * len(surprisal), [None] * len(surprisal), end=end))
    fitted = fit_heldout(ScoringConfig(), held_out)
    assert fitted.heldout_sessions == 490
    lines = scores(fitted, session(rng, 20))
    assert fitted.session_score(lines, fitted.end_score(8.5)) > THRESHOLD
    assert fitted.session_score(lines, fitted.end_score(0.1)) < THRESHOLD
