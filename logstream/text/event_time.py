"""A log line's own time, read from a timestamp at its start.

Three shapes are recognised, after an optional `[`:

- ISO 8601 / RFC 3339: `2026-11-02T08:00:03.119Z`, `2026-11-02T08:00:03+02:00`;
- the same with a space and a comma or dot before the fraction, as Python's
  logging and log4j write it: `2026-11-02 08:00:03,119`;
- syslog (RFC 3164): `Jun 14 15:16:01`.

Trade-offs, stated once:
- A timestamp without a zone (syslog, `YYYY-MM-DD HH:MM:SS,mmm`) is read as
  UTC, not the host's local zone: a log shipped elsewhere keeps its meaning,
  and the result does not depend on where logstream runs.
- Syslog has no year. The year is the reference time's (now, by default),
  unless that puts the line more than a day in the future: then it is the
  year before (a `Dec 31 23:59:59` line read on January 1st).
- A line whose start looks like a timestamp but is not a valid time
  (`2026-13-40 ...`) has no event time; that is never an error.

`line_time` never raises on any input; `with_event_time` fills
`LogRecord.timestamp` for records that have none, so alerts start at the
log's time (`startsAt`) rather than at the moment the line was read.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache

from logstream.records import LogRecord

# Bounded quantifiers only, anchored at the start: linear in the (short) prefix it reads.
_ISO = re.compile(
    r"\[?(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})"
    r"(?:[.,](\d{1,9}))?"  # fraction: `.119` (ISO) or `,119` (Python logging, log4j)
    r"(Z|z|[+-]\d{2}(?::?\d{2})?)?"  # zone: Z, +02, +0200, +02:00; none = UTC
    r"(?![\d.,:])"  # no half-read number (`08:00:03.x`, `08:00:030`)
)
_SYSLOG = re.compile(r"\[?([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?![\d:])")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1
    )
}
FUTURE_SLACK_SECONDS = 86_400.0  # syslog: a line further ahead than this is from last year


def line_time(line: str, now: float | None = None) -> float | None:
    """The unix time of the timestamp at the start of `line`, or None when it has none.

    `now` (unix seconds, default the clock) only picks the year of a syslog timestamp.
    """
    try:
        if match := _ISO.match(line):
            return _iso(match)
        if match := _SYSLOG.match(line):
            return _syslog(match, time.time() if now is None else now)
    except (ValueError, OverflowError):  # matched digits that are no date: Feb 30, hour 25
        return None
    return None


def with_event_time(
    records: Iterable[LogRecord], clock: Callable[[], float] = time.time
) -> Iterator[LogRecord]:
    """The records, each without a timestamp given the one at the start of its line (if any)."""
    for record in records:
        if record.timestamp is None and (stamp := line_time(record.line, clock())) is not None:
            record = dataclasses.replace(record, timestamp=stamp)
        yield record


def _iso(match: re.Match[str]) -> float:
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    stamp = _minute_start(year, month, day, hour, minute, zone) + _second(int(second))
    return stamp + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


@lru_cache(maxsize=1024)
def _minute_start(
    year: str | int, month: str | int, day: str, hour: str, minute: str, zone: str | None
) -> float:
    """Unix time of the minute's start, from its digits; ValueError if there is no such minute.
    Cached: a log's lines share their minutes, and building a datetime was most of a line's
    parse time."""
    stamp = datetime(int(year), int(month), int(day), int(hour), int(minute), tzinfo=_zone(zone))
    return stamp.timestamp()


def _second(second: int) -> int:
    if second > 59:  # as datetime() refuses it (no leap seconds)
        raise ValueError(f"second must be in 0..59, not {second}")
    return second


def _zone(zone: str | None) -> timezone:
    if zone is None or zone in "Zz":
        return UTC
    digits = zone[1:].replace(":", "")
    offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    return timezone(-offset if zone[0] == "-" else offset)


def _syslog(match: re.Match[str], now: float) -> float | None:
    month = _MONTHS.get(match.group(1))
    if month is None:
        return None
    day, hour, minute, second = match.groups()[1:]
    year = datetime.fromtimestamp(now, UTC).year
    for candidate in (year, year - 1):
        try:
            stamp = _minute_start(candidate, month, day, hour, minute, None) + _second(int(second))
        except ValueError:  # Feb 29 outside a leap year: try the year before
            continue
        if stamp <= now + FUTURE_SLACK_SECONDS:
            return stamp
    return None
