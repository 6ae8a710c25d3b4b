"""Severity from content: level fields and case-insensitive failure words, as a prior in nats."""

from __future__ import annotations

import pytest
from logstream.severity import line_severity

from logstream.scoring import Calibration, ScoringConfig


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        ("Jun 14 15:16:01 combo kernel: Out of memory: Kill process 2337 (java)", "critical"),
        # the kernel writes a filesystem's errors at KERN_CRIT, a buffer's I/O errors at KERN_ERR
        ("kernel: EXT3-fs error (device sda1): ext3_find_entry: reading directory", "critical"),
        ("kernel: EXT4-fs error (device sda1): ext4_lookup:1602: inode #2", "critical"),
        ("kernel: Remounting filesystem read-only", "critical"),
        ("kernel: Buffer I/O error on device sdb2, logical block 9778938", "error"),
        ("Offline image is: read-only", "error"),
        ("httpd[2201]: segfault at 0 ip 00007f sp 00007f error 4 in libc.so", "critical"),
        ("sshd[42]: fatal: Read from socket failed: Connection reset by peer", "critical"),
        ("app: request failed after 3 retries", "error"),
        ("worker: connection timed out", "error"),
        ("cron: job done, 0 errors", None),
        ("backup finished with no error", None),
        ("2015-10-18 18:01:47,978 INFO [main] started", "info"),
        ("2015-10-18 18:01:47,978 WARN [main] disk slow", "warning"),
        ("2015-10-18 18:01:47,978 INFO [main] task failed", "info"),
        ("2015-10-18 18:01:47,978 WARN [main] task failed", "error"),
        ("2015-07-29 17:41:44,747 - INFO  [QuorumPeer[myid=1]] - Notification time out: 3200", "info"),
        ("ntpd[2000]: synchronized to 10.100.14.250, stratum 3", None),
        ("kernel: Intel machine check reporting enabled on CPU#0.", None),
        ("kernel: Enabling unmasked SIMD FPU exception support... done.", None),
        ("kernel: There is already a security framework initialized, register_security failed.", "error"),
        ("disk check ok, then sda: I/O error", "error"),
        ("RAS KERNEL INFO power module status fault detected", "info"),  # the level field decides
        ("kernel: power module status fault detected on node 12", "error"),
        ("kernel: httpd[2201]: segfault at 0 ip 00007f", "critical"),  # `fault` inside a word: not it
    ],
)
def test_severity_reads_level_fields_and_failure_words(line: str, severity: str | None) -> None:
    """Lower-case failure words count like a level; a level field counts; negated counts do not,
    nor do words followed by a success word (a feature that works); words do not raise a line
    its writer marked info or debug, they do raise a warning."""
    assert line_severity(line) == severity


def test_lower_case_failure_words_get_the_prior() -> None:
    """A lower-case `error` line gets the error prior in its raw score; a plain line gets none."""
    config = ScoringConfig()
    plain = config.evidence(2.0, config.severity("kernel: device ready"), novel=False)
    failing = config.evidence(2.0, config.severity("kernel: device error on sda"), novel=False)
    assert failing - plain == pytest.approx(config.severity_prior["error"])


def test_content_severity_can_be_switched_off() -> None:
    """With content_severity off only the level field counts (the ablation of docs/quality.md)."""
    config = ScoringConfig(content_severity=False)
    assert config.severity("kernel: Out of memory: Kill process 1") is None
    assert config.severity("ERROR db: down") == "error"


def test_success_words_are_configurable() -> None:
    """An empty list of success words gives a failure word back its severity; a user's word counts."""
    line = "kernel: Intel machine check reporting enabled on CPU#0."
    assert ScoringConfig().severity(line) is None
    assert ScoringConfig(success_words=[]).severity(line) == "critical"
    assert ScoringConfig(success_words=["recovered"]).severity("raid: disk error, recovered") is None


def test_success_words_are_saved_and_older_models_keep_none() -> None:
    """The words travel with a model; one saved without them was calibrated without them, so
    it keeps scoring without them."""
    line = "kernel: Intel machine check reporting enabled on CPU#0."
    saved = Calibration(config=ScoringConfig(success_words=["enabled"])).to_json()
    assert Calibration.from_json(saved).config.severity(line) is None
    del saved["config"]["success_words"]
    assert Calibration.from_json(saved).config.severity(line) == "critical"


def test_bad_failure_word_is_a_clear_error() -> None:
    """A failure-word or success-word regex that does not compile names its list and pattern."""
    with pytest.raises(ValueError, match=r"failure_words.error: invalid regex"):
        ScoringConfig(failure_words={"error": ["(unclosed"]})
    with pytest.raises(ValueError, match=r"success_words: invalid regex"):
        ScoringConfig(success_words=["(unclosed"])


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
    assert ScoringConfig(failure_words={"error": [word]}).severity(line) == "error"
