"""The burst discount (a switch, off by default): a pattern the stream just repeated is
less surprising each time.

A small model does not learn to copy from its context, so without the discount every line
of a burst of a rare pattern scores as high as its first (docs/quality.md).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from logstream.detector import Detector
from logstream.patterns import RecentPatterns
from logstream.records import LogRecord
from logstream.scoring import DEFAULT_REPEAT_WINDOW, ScoringConfig
from logstream.synth import generate_lines


def test_recent_patterns_counts_within_the_window_per_stream() -> None:
    recent = RecentPatterns(window=3)
    assert [recent.add("a", 7) for _ in range(4)] == [0, 1, 2, 3]
    assert recent.add("b", 7) == 0  # another stream has its own history
    assert [recent.add("a", t) for t in (1, 2, 3)] == [0, 0, 0]
    assert recent.add("a", 7) == 0  # the three 7s left the window
    recent.drop("a")
    assert recent.add("a", 3) == 0
    recent.clear()
    assert recent.add("b", 7) == 0


def test_recent_patterns_is_bounded_and_can_be_off() -> None:
    recent = RecentPatterns(window=8, max_streams=2)
    for stream in ("a", "b", "c"):  # "a" is the least recently used when "c" arrives
        recent.add(stream, 1)
    assert recent.add("a", 1) == 0 and recent.add("c", 1) == 1
    off = RecentPatterns(window=0)
    assert [off.add("a", 1) for _ in range(3)] == [0, 0, 0]


def test_each_repeat_lowers_the_evidence_by_log_one_plus_count() -> None:
    assert ScoringConfig().repeat_window == DEFAULT_REPEAT_WINDOW == 0  # off by default
    config = ScoringConfig(repeat_window=128)
    first = config.evidence(6.0, "error", novel=False, repeats=0)
    assert config.evidence(6.0, "error", novel=False, repeats=4) == pytest.approx(first - math.log(5))
    assert ScoringConfig().evidence(6.0, "error", novel=False, repeats=4) == first


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="repeat_window"):
        ScoringConfig(repeat_window=-1)


def test_a_burst_of_a_new_pattern_is_discounted_after_its_start(
    synthetic_model_dir: Path,
) -> None:
    """Thirty copies of a line the model never saw, in one stream after normal traffic: the
    k-th copy's evidence is its surprisal and prior minus log(1 + k), so the burst ranks
    below its start; the first copy alerts; another stream is unaffected."""
    detector = Detector.load(synthetic_model_dir, device="cpu")
    assert detector.scoring.repeat_window == 0
    detector.calibration = replace(
        detector.calibration, config=replace(detector.scoring, repeat_window=128)
    )  # the same tails, the discount on
    detector.score([LogRecord(line=line, stream="web-0") for line in generate_lines(200, seed=41).lines])
    new = "2024-01-01T00:00:00.000Z web-0 ERROR db: connection pool exhausted (active=60, waiting=200)"
    burst = detector.score([LogRecord(line=new, stream="web-0")] * 30)
    assert [s.repeats for s in burst] == list(range(30))
    prior = detector.scoring.severity_prior["error"]
    assert [s.raw for s in burst] == pytest.approx(
        [s.surprisal + prior - math.log1p(k) for k, s in enumerate(burst)]
    )
    assert burst[0].is_anomaly and burst[-1].score < burst[0].score
    other = detector.score([LogRecord(line=new.replace("web-0", "web-1"), stream="web-1")])
    assert other[0].repeats == 0 and other[0].is_anomaly
