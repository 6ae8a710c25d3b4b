"""Lines that follow an alert: an incident writes several lines at once, and they alert together.

An OOM kill writes `Out of memory: Kill process 5455 (python)` and, in the same second,
`Killed process 5455 (python) total-vm:...`; a failing disk `EXT3-fs error`, `Buffer I/O
error`, `Remounting filesystem read-only`. The first line names the failure best and alerts.
The line tail judges each of the others as one line of a normal stream, where an unseen line
a little more surprising than usual is no news, so they may sit under the threshold: on-call
gets the headline without the lines that say what it did.

A line *follows* an alert when all of these hold:
- the previous line of its source (syslog's `host program`, or a log4j logger:
  `quiet.header`) in its stream alerted, or followed an alert, in the same second of the
  log's own time;
- the model has not seen its like (`scoring.unseen`): a known line next to an alert stays
  a known line;
- it names a failure itself: its severity (`severity.line_severity`) is error or critical.
  Without this test a kernel boot that raised one false alarm made every unseen boot line of
  that second alert with it (docs/quality.md, "Following alerts"). Or the process that wrote
  the alert wrote it too (the same pid in the header), not as a routine line (a debug or
  info level): sshd's `error: beginning MaxStartups throttling`, then its `drop connection`
  lines. The kernel names no pid, so its boot lines stay apart.
It then takes the score of the alert it follows: the probability of the incident it is part
of, not of the line alone. No constant is new: the second is the log's own resolution, the
other two tests are the detector's.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import NamedTuple

from logstream.quiet import MAX_SOURCES, header
from logstream.severity import ROUTINE_LEVELS, SEVERITY_RANK

# ((stream, source), the second of the log's own time, the writing process's id or None)
Place = tuple[tuple[str, str], int, str | None]


class Followed(NamedTuple):
    """The alert a line follows."""

    score: float
    same_process: bool  # the line's header names the pid that wrote the alert


def place(stream: str, line: str) -> Place | None:
    """Where and when the line was written, or None when its source or time is unknown."""
    found = header(line)
    if found is None:
        return None
    source, stamp, process = found
    return (stream, source), int(stamp), process


def names_its_part(followed: Followed, level: str | None, same_process_counts: bool) -> bool:
    """The module's third test, for a line of severity `level` after the alert `followed`: it
    names a failure, or (with `same_process_counts`) the alert's own process wrote it, not as
    a routine line."""
    if SEVERITY_RANK.get(level or "", 0) >= SEVERITY_RANK["error"]:
        return True
    return same_process_counts and followed.same_process and level not in ROUTINE_LEVELS


class AlertFollowing:
    """Per (stream, source) whose last line alerted (or followed): that line's second, score and pid.
    A source's next line, whatever it is, ends its entry. Only alerts are kept, so a stream
    with none `pending` needs no line's place: most lines are not parsed at all. Bounded: the
    alert written longest ago is forgotten first."""

    def __init__(self, max_sources: int = MAX_SOURCES) -> None:
        self.max_sources = max_sources
        self._alerts: OrderedDict[tuple[str, str], tuple[int, float, str | None]] = OrderedDict()
        self._pending: Counter[str] = Counter()  # stream -> its entries

    def pending(self, stream: str) -> bool:
        """Whether a line of `stream` may follow an alert (or end one's entry)."""
        return self._pending.get(stream, 0) > 0

    def alert_before(self, at: Place | None) -> Followed | None:
        """The alert that a line written `at` follows in time and source (see the module), or None."""
        if at is None:
            return None
        last = self._alerts.get(at[0])
        if last is None or last[0] != at[1]:
            return None
        return Followed(last[1], at[2] is not None and last[2] == at[2])

    def record(self, at: Place | None, alert_score: float | None) -> None:
        """A line written `at` was scored: `alert_score` if it alerted or followed, else None."""
        if at is None:
            return
        if alert_score is None:
            if self._alerts.pop(at[0], None) is not None:
                self._ended(at[0][0])
            return
        if at[0] not in self._alerts:
            self._pending[at[0][0]] += 1
        self._alerts[at[0]] = (at[1], alert_score, at[2])
        self._alerts.move_to_end(at[0])
        if len(self._alerts) > self.max_sources:
            (stream, _), _ = self._alerts.popitem(last=False)
            self._ended(stream)

    def _ended(self, stream: str) -> None:
        """One of the stream's entries is gone; a stream with none is not kept (streams come and go)."""
        self._pending[stream] -= 1
        if not self._pending[stream]:
            del self._pending[stream]

    def clear(self) -> None:
        self._alerts.clear()
        self._pending.clear()
