"""A line's level: its level field or its failure words, and the prior it adds to the score."""

from __future__ import annotations

import pytest

from logstream.scoring.calibration import Calibration
from logstream.scoring.config import ScoringConfig
from logstream.scoring.levels import line_level


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("Jun 14 15:16:01 combo kernel: Out of memory: Kill process 2337 (java)", "critical"),
        ("httpd[2201]: segfault at 0 ip 00007f sp 00007f error 4 in libc.so", "critical"),
        ("sshd[42]: fatal: Read from socket failed: Connection reset by peer", "critical"),
        ("kernel: EXT3-fs error (device sda1): ext3_find_entry: reading directory", "error"),
        ("kernel: Remounting filesystem read-only", "error"),
        ("kernel: Buffer I/O error on device sdb2, logical block 9778938", "error"),
        ("app: request failed after 3 retries", "error"),
        ("worker: connection timed out", "error"),
        ("kernel: power module status fault detected on node 12", "error"),
        ("disk check ok, then sda: I/O error", "error"),  # a success word before the failure
        ("2015-10-18 18:01:47,978 INFO [main] started", "info"),
        ("2015-10-18 18:01:47,978 WARN [main] disk slow", "warning"),
        ("2015-10-18 18:01:47,978 WARN [main] task failed", "error"),  # words raise a warning
        ("2015-10-18 18:01:47,978 INFO [main] task failed", "info"),  # not a routine level
        ("RAS KERNEL INFO power module status fault detected", "info"),
        ("ntpd[2000]: synchronized to 10.100.14.250, stratum 3", None),
        ("kernel: Intel machine check reporting enabled on CPU#0.", None),  # a success word after
        ("kernel: Enabling unmasked SIMD FPU exception support... done.", None),
    ],
)
def test_level_field_and_failure_words(line: str, level: str | None) -> None:
    """Failure words count like a level field; words do not raise a line its writer marked info
    or debug, they do raise a warning; a failure word followed by a success word does not count."""
    assert line_level(line) == level


def test_the_level_field_alone_without_words() -> None:
    """An empty vocabulary leaves the level field: what a site that trusts its levels sets."""
    config = ScoringConfig(failure_words={})
    assert config.level("kernel: Out of memory: Kill process 1") is None
    assert config.level("ERROR db: down") == "error"


def test_the_prior_adds_orders_of_magnitude_to_the_calibrated_score() -> None:
    """A level's prior is added to the tail score: the same surprisal scores `prior` higher."""
    config = ScoringConfig(level_prior={"warning": 0.5, "error": 1.0, "critical": 2.0})
    calibration = Calibration(config=config)
    plain = calibration.line_score(3.0, None)
    assert calibration.line_score(3.0, "error") - plain == pytest.approx(1.0)
    assert calibration.line_score(3.0, "critical") - plain == pytest.approx(2.0)
    assert calibration.line_score(3.0, "info") == plain


def test_success_words_are_configurable() -> None:
    """An empty list of success words gives a failure word back its level; a user's word counts."""
    line = "kernel: Intel machine check reporting enabled on CPU#0."
    assert ScoringConfig().level(line) is None
    assert ScoringConfig(success_words=[]).level(line) == "critical"
    assert ScoringConfig(success_words=["recovered"]).level("raid: disk error, recovered") is None


def test_the_words_are_saved_with_the_model() -> None:
    """A model's vocabulary travels in its calibration: a site's own words survive a reload."""
    config = ScoringConfig(failure_words={"error": ["brownout"]}, success_words=[])
    loaded = Calibration.from_json(Calibration(config=config).to_json()).config
    assert loaded.level("psu: brownout on rail 2") == "error"
    assert loaded.level("kernel: Out of memory") is None


def test_bad_words_are_a_clear_error() -> None:
    """A failure-word or success-word regex that does not compile names its list and pattern;
    an unknown level is named."""
    with pytest.raises(ValueError, match=r"failure_words.error: invalid regex"):
        ScoringConfig(failure_words={"error": ["(unclosed"]})
    with pytest.raises(ValueError, match=r"success_words: invalid regex"):
        ScoringConfig(success_words=["(unclosed"])
    with pytest.raises(ValueError, match=r"unknown level 'severe'"):
        ScoringConfig(failure_words={"severe": ["boom"]})


@pytest.mark.parametrize(
    ("word", "line"),
    [
        ("oops|uh-oh", "job: uh-oh, it broke"),  # alternation at the top: either side may start it
        ("[xy]fail", "disk: yfail on sda"),  # a class
        ("e?rror", "disk: rror on sda"),  # an optional first letter
        ("(?:bad|worse) block", "disk: worse block 7"),  # a group
        (r"\d+ lost", "net: 3 lost"),  # an escape
        ("boom", "job: BOOM"),  # a plain word: the prefilter, case-insensitive
    ],
)
def test_custom_failure_words_match_whatever_they_start_with(word: str, line: str) -> None:
    """The search skips word starts that no failure word can begin with; a regex whose first
    character is not plain to see turns that off instead of missing its matches."""
    assert ScoringConfig(failure_words={"error": [word]}).level(line) == "error"
