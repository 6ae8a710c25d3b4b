"""Lines that follow an alert: an incident writes several lines at once, and they alert together.

An OOM kill writes `Out of memory: Kill process 5455 (python)` and, in the same second,
`Killed process 5455 (python) total-vm:...`; a failing disk `EXT3-fs error`, `Buffer I/O
error`, `Remounting filesystem read-only`. The first line names the failure best and alerts. The line tail judges each of the others as one line of a normal
stream, where an unseen line a little more surprising than usual is no news, so they may sit
under the threshold: on-call gets the headline without the lines that say what it did.

A line *follows* an alert when all of these hold:
- the previous line of its source (syslog's `host program`, or a log4j logger:
  `quiet.source_of`) in its stream alerted, or followed an alert, in the same second of the
  log's own time;
- the model has not seen its like (`scoring.unseen`): a known line next to an alert stays
  a known line;
- it names a failure itself: its severity (`severity.line_severity`) is error or critical.
  Without this test a kernel boot that raised one false alarm made every unseen boot line of
  that second alert with it (docs/quality.md, "Following alerts").
It then takes the score of the alert it follows: the probability of the incident it is part
of, not of the line alone. No constant is new: the second is the log's own resolution, the
other two tests are the detector's.
"""

from __future__ import annotations

from collections import OrderedDict

from logstream.quiet import MAX_SOURCES, source_of

Place = tuple[tuple[str, str], int]  # ((stream, source), the second of the log's own time)


def place(stream: str, line: str) -> Place | None:
    """Where and when the line was written, or None when its source or time is unknown."""
    found = source_of(line)
    if found is None:
        return None
    source, stamp = found
    return (stream, source), int(stamp)


class AlertFollowing:
    """Per (stream, source): the second of its last line, and the score that line alerted
    with (None: it did not). Bounded: the source written longest ago is forgotten first."""

    def __init__(self, max_sources: int = MAX_SOURCES) -> None:
        self.max_sources = max_sources
        self._last: OrderedDict[tuple[str, str], tuple[int, float | None]] = OrderedDict()

    def alert_before(self, at: Place | None) -> float | None:
        """The score of the alert that a line written `at` follows (see the module), or None."""
        if at is None:
            return None
        last = self._last.get(at[0])
        return last[1] if last is not None and last[0] == at[1] else None

    def record(self, at: Place | None, alert_score: float | None) -> None:
        """A line written `at` was scored: `alert_score` if it alerted or followed, else None."""
        if at is None:
            return
        self._last[at[0]] = (at[1], alert_score)
        self._last.move_to_end(at[0])
        if len(self._last) > self.max_sources:
            self._last.popitem(last=False)

    def clear(self) -> None:
        self._last.clear()
