"""Context lines for an alert: what the stream said just before (and after) the anomaly.

A responder reads the anomalous line in its stream's context, as `grep -B2 -A2`
would show it. `LineContext` keeps the last `before` lines of each stream
(across batches) and takes the `after` lines from the batch being handed off.

Trade-off, chosen so that no alert waits or is lost: the lines *after* an
anomaly are attached only when they arrived in the same batch. Waiting for
later lines would hold the anomaly out of the outbox, and so hold the source's
offset commit, for as long as the stream stays quiet. Under load batches are
large, so an anomaly usually has its next lines; at a trickle it may have none.

Memory is bounded: at most `max_streams` streams (least recently seen dropped
first) and each kept line cut to `max_chars`.

A replay has the whole file, so the lines after an anomaly always come: `follow`
takes one line at a time and holds an anomaly until its stream's next `after`
lines have passed (or `finish`), as `attach` over the whole file would.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from logstream.records import Anomaly

if TYPE_CHECKING:
    from logstream.detector import Detector, ScoredLine

DEFAULT_LINES = 2
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_MAX_CHARS = 500


class LineContext:
    """Per stream, the last `before` lines seen; attaches context to a batch's anomalies."""

    def __init__(
        self,
        before: int = DEFAULT_LINES,
        after: int = DEFAULT_LINES,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self.before = before
        self.after = after
        self.max_streams = max_streams
        self.max_chars = max_chars
        self._recent: OrderedDict[str, deque[str]] = OrderedDict()
        self._held: deque[tuple[Anomaly, list[str]]] = deque()  # `follow`: in order, with their lines after
        self._open: dict[str, list[list[str]]] = {}  # stream -> lines after of its held anomalies, not full

    def attach(self, lines: Sequence[tuple[str, str]], flagged: Mapping[int, Anomaly]) -> list[Anomaly]:
        """`lines`: (stream, line) of a batch in order; `flagged`: batch index -> its anomaly.

        Returns the anomalies (in batch order) with `context_before`/`context_after` set,
        and remembers the batch's lines for the next one."""
        positions: dict[str, list[int]] = {}
        for i, (stream, _) in enumerate(lines):
            positions.setdefault(stream, []).append(i)
        seen: dict[str, int] = {}  # stream -> lines of it passed so far in this batch
        out = []
        for i, (stream, line) in enumerate(lines):
            k = seen.get(stream, 0)
            seen[stream] = k + 1
            if i in flagged:
                later = positions[stream][k + 1 : k + 1 + self.after]
                out.append(
                    dataclasses.replace(
                        flagged[i],
                        context_before=tuple(self._recent.get(stream, ())),
                        context_after=tuple(self._cut(lines[j][1]) for j in later),
                    )
                )
            self._remember(stream, line)
        return out

    def follow(self, stream: str, line: str, anomaly: Anomaly | None) -> list[Anomaly]:
        """The next line of a replay (and its anomaly, if any). Returns the anomalies, in order,
        whose lines after are now complete; `finish` returns the rest."""
        waiting = []
        for after in self._open.pop(stream, ()):
            after.append(self._cut(line))
            if len(after) < self.after:
                waiting.append(after)
        if anomaly is not None:
            before = tuple(self._recent.get(stream, ()))
            self._held.append((dataclasses.replace(anomaly, context_before=before), []))
            if self.after > 0:
                waiting.append(self._held[-1][1])
        if waiting:
            self._open[stream] = waiting
        self._remember(stream, line)
        done = []
        while self._held and len(self._held[0][1]) >= self.after:
            done.append(self._release())
        return done

    def finish(self) -> list[Anomaly]:
        """The anomalies still held by `follow` (their streams ended first)."""
        self._open.clear()
        return [self._release() for _ in range(len(self._held))]

    def _release(self) -> Anomaly:
        anomaly, after = self._held.popleft()
        return dataclasses.replace(anomaly, context_after=tuple(after))

    def _remember(self, stream: str, line: str) -> None:
        if self.before <= 0:
            return
        recent = self._recent.get(stream)
        if recent is None:
            recent = self._recent[stream] = deque(maxlen=self.before)
            while len(self._recent) > self.max_streams:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(stream)
        recent.append(self._cut(line))

    def _cut(self, line: str) -> str:
        return line if len(line) <= self.max_chars else line[: self.max_chars - 1] + "…"


def anomaly_of(detector: Detector, scored: ScoredLine) -> Anomaly | None:
    """The detector's anomaly for a scored line (None below the threshold), with its
    explanation in words: the sentence replay's table prints under the line
    (`explain.Explanation.summary`), so a page says what the backtest said."""
    anomaly = detector.anomaly(scored)
    if anomaly is None or scored.explanation is None:
        return anomaly
    return dataclasses.replace(anomaly, explanation=scored.explanation.summary)


def anomalies_of(detector: Detector, context: LineContext, scored: Sequence[ScoredLine]) -> list[Anomaly]:
    """A scored batch's anomalies, lines first (with the stream's lines around them), then
    stream ends: what serve and `logstream tail` hand to the alert sink."""
    lines = [s for s in scored if s.kind == "line"]
    flagged = {i: a for i, s in enumerate(lines) if (a := anomaly_of(detector, s)) is not None}
    anomalies = context.attach([(s.record.stream, s.record.line) for s in lines], flagged)
    return anomalies + [a for s in scored if s.kind != "line" and (a := anomaly_of(detector, s)) is not None]
