"""Crash words: an unseen line whose own words are critical scores the critical prior again,
after the tail, as the probability factor e^3 it stands for (+1.3 in -log10 p).

In the evidence the prior is worth what the tail makes of 3 nats where the line lands; on a
heavy tail (a log whose held-out lines are often unseen) that is a tenth of an order of
magnitude, and an unseen OOM kill scored like an unseen boot line (docs/quality.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from logstream.detector import line_evidence
from logstream.replay import Unit, _row
from logstream.scoring import Calibration, ScoringConfig, unseen
from logstream.severity import critical_by_words

V = 512  # the tiny preset's vocabulary: a line is unseen when its median token costs > ln V / 2
OOM = "Jun 18 02:08:11 combo kernel: Out of memory: Kill process 16986 (java) score 699"


@pytest.mark.parametrize(
    ("line", "critical"),
    [
        (OOM, True),
        ("kernel: httpd[21803]: segfault at c7a5c92 ip 7cbdc2ae99 error 4 in libc-2.3.4.so", True),
        ("RAS KERNEL FATAL rts panic! - stopping execution", True),
        ("kernel: EXT3-fs error (device sda1): ext3_find_entry", True),  # KERN_CRIT, in words
        ("kernel: Buffer I/O error on device sdb2, logical block 9778938", False),  # an error
        # the level field alone: BlueGene/L's ciod writes FATAL routinely
        ("RAS APP FATAL ciod: failed to read message prefix on control stream", False),
        ("2015-10-18 18:06:26,029 FATAL [IPC Server handler 13] TaskAttemptListener: exited", False),
        ("Jun 15 04:06:20 combo logrotate: ALERT exited abnormally with [1]", False),
        # the writer marked it routine, or a success word follows: as in line_severity
        ("2015-10-18 18:01:47,978 INFO [main] segfault handler installed", False),
        ("kernel: Intel machine check reporting enabled on CPU#0.", False),
    ],
)
def test_only_the_words_of_a_line_name_a_crash(line: str, critical: bool) -> None:
    assert critical_by_words(line) is critical


def evidence(config: ScoringConfig, line: str, token_nll: float) -> object:
    nll = np.full(8, token_nll)
    return line_evidence(
        Calibration(config=config), nll, line, word_starts=np.ones(8, dtype=bool), vocab_size=V
    )


def test_an_unseen_line_with_crash_words_gets_the_bonus() -> None:
    """Only a line the model does not know: a known OOM template is judged by its tail."""
    half = math.log(V) / 2
    config = ScoringConfig()
    assert unseen(np.full(8, half + 0.1), V) and not unseen(np.full(8, half - 0.1), V)
    assert evidence(config, OOM, half + 0.1).crash
    assert not evidence(config, OOM, half - 0.1).crash
    assert not evidence(config, "kernel: device ready", half + 0.1).crash
    assert not evidence(config, "RAS APP FATAL ciod: failed to read message prefix", half + 0.1).crash
    assert not evidence(ScoringConfig(crash_words=False), OOM, half + 0.1).crash
    assert not evidence(ScoringConfig(content_severity=False), OOM, half + 0.1).crash


def test_the_bonus_is_the_critical_prior_as_a_probability_factor() -> None:
    """e^3 in probability is 3 / ln 10 in -log10 p, added to whatever the tails say."""
    calibration = Calibration(config=ScoringConfig(severity_prior={"critical": 3.0}))
    plain = calibration.line_score(4.0)
    assert calibration.line_score(4.0, crash=True) - plain == pytest.approx(3 / math.log(10))
    raw = Calibration(config=ScoringConfig(tail_model="raw"))
    assert raw.line_score(4.0, crash=True) == raw.line_score(4.0)  # nats get no probability factor


def test_replay_rows_say_when_a_score_holds_the_bonus() -> None:
    """On-call reads why a line alerted: the row of `replay --out` carries the flag."""
    row = _row(Unit(stream="s", text=OOM, score=4.0, threshold=3.5, label=None, crash=True))
    assert row["crash"] is True and row["anomaly"] is True
    assert (
        _row(Unit(stream="s", text="kernel: device ready", score=1.0, threshold=3.5, label=None))["crash"]
        is False
    )
