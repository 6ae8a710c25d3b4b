"""logstream.text.event_time: the timestamp at the start of a log line, as unix seconds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from logstream.records import LogRecord
from logstream.text.event_time import line_time, with_event_time


def utc(*parts: int, micro: int = 0) -> float:
    return datetime(*parts, micro, tzinfo=UTC).timestamp()  # type: ignore[misc]


NOW = utc(2026, 6, 20, 12, 0, 0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2026-11-02T08:00:03.119Z worker-2 ERROR db", utc(2026, 11, 2, 8, 0, 3, micro=119_000)),
        ("2026-11-02T08:00:03Z web-0 INFO", utc(2026, 11, 2, 8, 0, 3)),
        ("2026-11-02T10:00:03+02:00 x", utc(2026, 11, 2, 8, 0, 3)),
        ("2026-11-02T03:00:03-0500 x", utc(2026, 11, 2, 8, 0, 3)),
        ("2026-11-02T08:00:03.123456789+00:00 x", utc(2026, 11, 2, 8, 0, 3) + 0.123456789),
        ("2026-11-02 08:00:03,119 INFO root: started", utc(2026, 11, 2, 8, 0, 3, micro=119_000)),
        ("2026-11-02 08:00:03.5 INFO", utc(2026, 11, 2, 8, 0, 3, micro=500_000)),
        ("[2026-11-02 08:00:03] INFO", utc(2026, 11, 2, 8, 0, 3)),
    ],
)
def test_iso_and_logging_timestamps(line: str, expected: float) -> None:
    """ISO 8601 / RFC 3339 and `YYYY-MM-DD HH:MM:SS[,.]mmm` starts parse; no zone means UTC."""
    assert line_time(line, now=NOW) == pytest.approx(expected, abs=1e-6)


def test_syslog_takes_the_current_year() -> None:
    """A syslog timestamp (no year) is in the reference time's year, read as UTC."""
    assert line_time("Jun 14 15:16:01 host sshd[42]: accepted", now=NOW) == utc(2026, 6, 14, 15, 16, 1)
    assert line_time("Jun  4 15:16:01 host cron", now=NOW) == utc(2026, 6, 4, 15, 16, 1)


def test_syslog_from_the_future_is_last_year() -> None:
    """A syslog line more than a day ahead of the reference time is from the year before."""
    new_year = utc(2027, 1, 1, 0, 0, 5)
    assert line_time("Dec 31 23:59:59 host kernel: tick", now=new_year) == utc(2026, 12, 31, 23, 59, 59)


@pytest.mark.parametrize(
    "line",
    [
        "worker-1 INFO job 9916: started",  # no timestamp
        "",
        "2026-13-40T08:00:03Z impossible date",
        "2026-11-02T25:00:03Z impossible hour",
        "2026-11-02T08:00:60Z no leap seconds",
        "2026-11-02T08:00:03+25:00 zone out of range",
        "Jun 14 15:16:60 host no leap seconds",
        "Feb 29 08:00:03 host: not a leap year in 2026 nor 2025",
        "Foo 14 15:16:01 not a month",
        "12026-11-02T08:00:03Z five-digit year",
        "2026-11-02T08:00:030 too many digits",
        "INFO 2026-11-02T08:00:03Z not at the start",
        "\x00\udcff" * 100,
    ],
)
def test_no_timestamp_is_none(line: str) -> None:
    """A line without a valid timestamp at its start has no event time (never an error)."""
    assert line_time(line, now=NOW) is None


def test_lines_of_one_minute_keep_their_own_seconds() -> None:
    """Lines share a minute's start (cached), never their seconds, fractions or zones."""
    for second in (0, 59, 7, 0):
        for fraction, micro in (("", 0), (".25", 250_000)):
            line = f"2026-11-02T08:00:{second:02d}{fraction}Z x"
            assert line_time(line, now=NOW) == utc(2026, 11, 2, 8, 0, second, micro=micro), line
    assert line_time("2026-11-02T10:00:07+02:00 x", now=NOW) == utc(2026, 11, 2, 8, 0, 7)
    assert line_time("Jun 14 15:16:59 host", now=NOW) == utc(2026, 6, 14, 15, 16, 59)


def test_with_event_time_fills_only_missing_timestamps() -> None:
    """Records without a timestamp get their line's; a record's own timestamp is kept."""
    records = [
        LogRecord("2026-11-02T08:00:03Z web-0 INFO ok"),
        LogRecord("2026-11-02T08:00:03Z web-0 INFO ok", timestamp=5.0),
        LogRecord("web-0 INFO no time"),
    ]
    stamped = list(with_event_time(records, clock=lambda: NOW))
    assert [r.timestamp for r in stamped] == [utc(2026, 11, 2, 8, 0, 3), 5.0, None]
