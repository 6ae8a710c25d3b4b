"""A source that stopped logging: the quiet-source watch.

A line score cannot see a line that is not there, so a daemon that dies quietly, a cron
job that no longer runs or an agent that stopped shipping never alerts as a line. The watch
learns each source's rhythm from the stream itself and says when a source has been silent
for longer than its rhythm allows.

- **Source:** a syslog header's host and program (`Jun 14 15:16:01 combo sshd[19939]:` is
  `combo sshd`; also after an ISO 8601 time, and after columns before the header, as in
  Thunderbird's); else the logger of a log4j / Python logging line, after its ISO time, an
  optional pid, the level and an optional `[thread]` (`2015-10-18 18:01:47,978 INFO [main]
  org.apache.hadoop.mapreduce.v2.app.MRAppMaster:` is that class: the stream names the host).
  Lines without either header are not watched.
- **Rhythm:** the gaps between the distinct seconds a source logs in (a burst of lines in
  one second is one visit). The tail of a source's gaps is fitted like the line tail
  (`tail.fit_tail`: peaks over threshold, a generalized Pareto), so a daily job (gaps of a
  day, a bounded tail) and a chatty daemon (gaps of seconds with long breaks, a heavy one)
  each get their own limit, and one knob serves both.
- **Quiet:** a source is quiet once the time since its last line is a gap that a normal gap
  of it reaches with probability at most 10 ** -threshold, the line threshold (-log10 p per
  gap rather than per line, the same unit), *and* so is the stream's activity since: the
  distinct seconds the stream logged in, whose tail is fitted the same way. A host that
  slept (a laptop, a paused VM) wakes with every source far past its time limit; the second
  condition waits until the stream has been awake for longer than the source ever stayed
  away. It needs `tail.MIN_SAMPLES` gaps first, and a silence shorter than
  MIN_QUIET_SECONDS is never one: a source that logs every second is statistically quiet
  after 3 s, which no one should be paged for (alert rules' `for: 1m`).
- **Event time only:** the clock is the time of the stream's current line, not the latest
  ever seen, so one line from a wrong clock (a year ahead) cannot stop the watch. A replay
  therefore notices a silence at the same line as serve does, and the watch notices it only
  when another source of the stream logs past the limit. A stream that stops altogether is not
  this watch's to see (serve's `stream_idle_seconds` ends idle streams).
- A silence alerts once. The gap that ends it is not learned (a flagged gap never moves the
  fit, as the line tail's refit never takes a flagged line).
- **Baseline:** a source needs MIN_SAMPLES gaps before it can be judged: a daily job, 20
  days. `learn_baseline` runs the watch over a model's training lines (`train` saves the
  result with the model), and a source heard for the first time takes its baseline rhythm
  (`observe(..., baseline=)`) until it has MIN_SAMPLES gaps of its own: a new replay, a
  restarted or redeployed serve, watches it from its first line. Sources are matched by name
  alone (`host program`, a logger), whatever the stream; the stream's ticks are counted as
  the baseline's streams counted them, so a baseline read as one stream per file and a serve
  with one stream per host count different ticks (a larger tick limit: later, never sooner).

State is bounded: `max_sources` (stream, source) pairs, the least recently heard forgotten,
each with its `max_gaps` most recent gaps in time and in ticks (8 bytes each): at most 32 MiB
at the defaults, and no work per line that grows with the sources watched.
"""

from __future__ import annotations

import heapq
import math
import re
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from logstream.records import Stream
from logstream.scoring.gpd import MIN_SAMPLES, TailFit, count, finite, fit_tail
from logstream.text.event_time import line_time

MAX_SOURCES = 4096  # (stream, source) pairs watched
MAX_GAPS = 500  # a source's most recent gaps kept for its fit
REFIT_EVERY = 20  # new gaps between refits of a source's tail
MIN_QUIET_SECONDS = 60.0  # the shortest silence that is ever reported
HEADER_CHARS = 200  # how far into a line the syslog header may start
_HEADER = re.compile(
    r"(?:^|\s)\[?([A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?)\]? "
    r"(\S+) ([^\s\[:]+)(?:\[(\d+)\])?:"  # host, program[pid]:
)
_LOGGER = re.compile(
    r"(?:^|\s)\[?(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)\]?,?(?: -)? +"
    r"(?:(\d+) +)?(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL|CRITICAL|Info|Warning|Error)\s+"  # [pid] LEVEL
    r"(?:\[[^\]]*\]\s+)?([A-Za-z][\w.$-]*)"  # [thread] logger
)


def header(line: str) -> tuple[str, float, str | None] | None:
    """The line's source (syslog: `host program`; log4j: the logger), its header's time and
    the writing process's id when the header names one; None without a header."""
    if match := _HEADER.search(line, 0, HEADER_CHARS):
        source, process = f"{match.group(2)} {match.group(3)}", match.group(4)
    elif match := _LOGGER.search(line, 0, HEADER_CHARS):
        source, process = match.group(3), match.group(2)
    else:
        return None
    stamp = line_time(match.group(1))
    return None if stamp is None else (source, stamp, process)


def source_of(line: str) -> tuple[str, float] | None:
    """The line's source and its header's time (`header`), or None."""
    found = header(line)
    return None if found is None else found[:2]


@dataclass(frozen=True)
class QuietSource:
    """A source whose silence crossed the threshold."""

    stream: str
    source: str  # `host program`, as its syslog header names them
    last_seen: float  # unix s of its last line
    noticed_at: float  # the stream's time when the watch noticed: a later line's time
    score: float  # -log10 P(a normal gap of the source lasts this long), at noticed_at
    threshold: float
    usual_gap: float  # median of its kept gaps, s
    longest_gap: float  # the longest kept gap, s
    gaps: int  # how many gaps its fit has
    from_baseline: bool = False  # its fit is its rhythm in the model's training lines

    def describe(self) -> str:
        where = (
            f"{self.gaps} gaps of the model's training lines"
            if self.from_baseline
            else f"its last {self.gaps} gaps"
        )
        return (
            f"<quiet source: {self.source} has not logged for {_span(self.noticed_at - self.last_seen)}; "
            f"it logged every {_span(self.usual_gap)} (median), at most {_span(self.longest_gap)} "
            f"apart in {where}>"
        )


@dataclass(frozen=True)
class BaselineRhythm:
    """A source's rhythm learned from a model's training lines (`learn_baseline`)."""

    fit: TailFit  # its gaps, s
    tick_fit: TailFit  # its gaps in the stream's ticks
    usual_gap: float  # median gap, s
    longest_gap: float
    gaps: int

    def to_json(self) -> dict:
        return {"fit": self.fit.to_json(), "tick_fit": self.tick_fit.to_json(), "usual_gap": self.usual_gap,
                "longest_gap": self.longest_gap, "gaps": self.gaps}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> BaselineRhythm:
        """A saved rhythm; raises ValueError/TypeError/KeyError naming the first bad field."""
        rhythm = cls(
            fit=TailFit.from_json(data["fit"]),
            tick_fit=TailFit.from_json(data["tick_fit"]),
            usual_gap=finite(data["usual_gap"], "usual_gap"),
            longest_gap=finite(data["longest_gap"], "longest_gap"),
            gaps=count(data["gaps"], "gaps"),
        )
        if not 0 < rhythm.usual_gap <= rhythm.longest_gap or rhythm.gaps < MIN_SAMPLES:
            raise ValueError(
                f"rhythm out of range: usual_gap {rhythm.usual_gap}, longest_gap {rhythm.longest_gap}, "
                f"gaps {rhythm.gaps} (at least {MIN_SAMPLES})"
            )
        return rhythm


Baseline = Mapping[str, BaselineRhythm]  # source -> its rhythm in the baseline


@dataclass
class _Rhythm:
    last: float  # its last line's time
    last_tick: int  # the stream's active seconds (ticks) at its last line
    gaps: array  # s between its visits (doubles, oldest first)
    tick_gaps: array  # the stream's ticks between its visits
    fit: TailFit | None = None
    tick_fit: TailFit | None = None
    new_gaps: int = 0  # since the last fit
    # the gap, in s and in ticks, whose tail probability is 10 ** -limits_for: once per fit and threshold
    gap_limit: float = math.inf
    tick_gap_limit: float = math.inf
    limits_for: float = math.nan
    deadline: float = math.inf  # when it turns quiet at the threshold it was last judged by
    tick_limit: float = math.inf  # ... and after how many of the stream's ticks
    alerted: bool = False  # its current silence has alerted
    seed: BaselineRhythm | None = None  # its fits until it has MIN_SAMPLES gaps of its own

    def summary(self) -> tuple[float, float, int]:
        """(median gap, longest gap, gaps) of what its fit was made from."""
        if self.seed is not None:
            return self.seed.usual_gap, self.seed.longest_gap, self.seed.gaps
        gaps = sorted(self.gaps)
        return gaps[len(gaps) // 2], gaps[-1], len(gaps)

    def fitted(self) -> tuple[TailFit, TailFit]:
        """Fits of its own gaps, in time and in ticks."""
        return fit_tail(np.asarray(self.gaps)), fit_tail(np.asarray(self.tick_gaps))

    def judge(self, threshold: float) -> None:
        """Set the deadline and tick limit: its last line plus the gaps its fits allow at `threshold`."""
        if self.fit is None or self.tick_fit is None:
            return
        if threshold != self.limits_for:
            rate = 10.0**-threshold
            self.gap_limit = max(MIN_QUIET_SECONDS, self.fit.raw_threshold(rate))
            self.tick_gap_limit = self.tick_fit.raw_threshold(rate)
            self.limits_for = threshold
        self.deadline = self.last + self.gap_limit
        self.tick_limit = self.last_tick + self.tick_gap_limit


@dataclass
class QuietWatch:
    """Per stream, each source's rhythm; `observe` each line in order, get the quiet sources."""

    max_sources: int = MAX_SOURCES
    max_gaps: int = MAX_GAPS
    _rhythms: OrderedDict[tuple[str, str], _Rhythm] = field(default_factory=OrderedDict)
    # stream -> (its last line's time, ticks: the distinct seconds it logged in)
    _clocks: dict[str, tuple[float, int]] = field(default_factory=dict)
    _due: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # stream -> heap of deadlines
    _sources: Counter[str] = field(default_factory=Counter)  # stream -> its sources watched

    def __len__(self) -> int:
        """How many (stream, source) pairs are watched."""
        return len(self._rhythms)

    def observe(
        self, stream: str, line: str, threshold: float | None, baseline: Baseline | None = None
    ) -> list[QuietSource]:
        """Take one line of `stream`; return the sources of the stream that its time shows quiet.
        A source heard for the first time takes its rhythm in `baseline`, if it has one.
        `threshold` None learns the rhythms only (a baseline) and judges no source."""
        found = source_of(line)
        if found is None:
            return []
        source, now = found[0], math.floor(found[1])  # whole seconds: a visit is a second
        previous, ticks = self._clocks.get(stream, (math.nan, 0))
        ticks += now != previous  # a new second of the stream's activity
        self._clocks[stream] = (now, ticks)
        self._hear(stream, source, now, ticks, threshold, baseline)
        return [] if threshold is None else self._quiet(stream, now, ticks, threshold)

    def _hear(
        self,
        stream: str,
        source: str,
        now: float,
        ticks: int,
        threshold: float | None,
        baseline: Baseline | None,
    ) -> None:
        key = (stream, source)
        rhythm = self._rhythms.get(key)
        if rhythm is None:
            seed = baseline.get(source) if baseline else None
            rhythm = self._rhythms[key] = _Rhythm(now, ticks, array("d"), array("d"), seed=seed)
            self._sources[stream] += 1
            self._forget()
            if seed is None:
                return
            rhythm.fit, rhythm.tick_fit = seed.fit, seed.tick_fit
        else:
            self._rhythms.move_to_end(key)
            if now <= rhythm.last:  # the same second (one visit), or a line out of order
                return
            self._learn(rhythm, now, ticks, refit=threshold is not None)
        if threshold is None:
            return
        rhythm.judge(threshold)
        if rhythm.deadline < math.inf:
            due = self._due.setdefault(stream, [])
            heapq.heappush(due, (rhythm.deadline, source))
            if len(due) > 4 * len(self._rhythms) + 64:  # stale entries: rebuild from the live deadlines
                self._due[stream] = self._deadlines(stream)

    def _learn(self, rhythm: _Rhythm, now: float, ticks: int, refit: bool) -> None:
        """The gap since its last line, into its gaps; `refit`: and into its fits, refitted
        once it has MIN_SAMPLES gaps of its own, then every REFIT_EVERY new ones."""
        if not rhythm.alerted:  # the gap that ends a flagged silence is not learned
            rhythm.gaps.append(now - rhythm.last)
            rhythm.tick_gaps.append(ticks - rhythm.last_tick)
            rhythm.new_gaps += 1
            if len(rhythm.gaps) > self.max_gaps:
                del rhythm.gaps[0], rhythm.tick_gaps[0]
        rhythm.last, rhythm.last_tick, rhythm.alerted = now, ticks, False
        due = rhythm.fit is None or rhythm.seed is not None or rhythm.new_gaps >= REFIT_EVERY
        if refit and due and len(rhythm.gaps) >= MIN_SAMPLES:
            rhythm.fit, rhythm.tick_fit = rhythm.fitted()
            rhythm.new_gaps, rhythm.limits_for, rhythm.seed = 0, math.nan, None  # its own fits: new limits

    def _quiet(self, stream: str, clock: float, ticks: int, threshold: float) -> list[QuietSource]:
        due, out = self._due.get(stream, []), []
        while due and due[0][0] < clock:
            deadline, source = heapq.heappop(due)
            rhythm = self._rhythms.get((stream, source))
            if rhythm is None or rhythm.alerted or rhythm.deadline != deadline:
                continue  # forgotten, alerted, or heard since: a stale entry
            rhythm.judge(threshold)  # the threshold may have moved since it was last heard
            if rhythm.deadline >= clock:
                heapq.heappush(due, (rhythm.deadline, source))
                continue
            assert rhythm.fit is not None  # only judged rhythms have a finite deadline
            score = rhythm.fit.score(clock - rhythm.last)
            if ticks <= rhythm.tick_limit or score <= threshold:  # the stream has not been awake long enough
                rhythm.deadline = clock  # look again at the stream's next second
                heapq.heappush(due, (clock, source))
                continue
            rhythm.alerted = True
            usual_gap, longest_gap, gaps = rhythm.summary()
            out.append(
                QuietSource(
                    stream=stream,
                    source=source,
                    last_seen=rhythm.last,
                    noticed_at=clock,
                    score=score,
                    threshold=threshold,
                    usual_gap=usual_gap,
                    longest_gap=longest_gap,
                    gaps=gaps,
                    from_baseline=rhythm.seed is not None,
                )
            )
        return out

    def _deadlines(self, stream: str) -> list[tuple[float, str]]:
        heap = [
            (r.deadline, source)
            for (s, source), r in self._rhythms.items()
            if s == stream and r.deadline < math.inf and not r.alerted
        ]
        heapq.heapify(heap)
        return heap

    def _forget(self) -> None:
        """Past `max_sources`: forget the least recently heard source (and its stream's clock
        once it has none left)."""
        while len(self._rhythms) > self.max_sources:
            (stream, _), _ = self._rhythms.popitem(last=False)
            self._sources[stream] -= 1
            if not self._sources[stream]:
                del self._sources[stream]
                self._clocks.pop(stream, None)
                self._due.pop(stream, None)


def learn_baseline(streams: Iterable[Stream]) -> dict[str, BaselineRhythm]:
    """Each source's rhythm in baseline `streams` (its lines in order per stream), for the
    sources with at least MIN_SAMPLES gaps; a source in several streams keeps the stream
    where it has the most gaps."""
    watch = QuietWatch()
    for stream in streams:
        for line in stream.lines:
            watch.observe(stream.name, line, None)
    best: dict[str, _Rhythm] = {}
    for (_, source), rhythm in watch._rhythms.items():
        if len(rhythm.gaps) >= MIN_SAMPLES and (
            source not in best or len(rhythm.gaps) > len(best[source].gaps)
        ):
            best[source] = rhythm
    return {source: BaselineRhythm(*rhythm.fitted(), *rhythm.summary()) for source, rhythm in best.items()}


def _span(seconds: float) -> str:
    """A duration as people read it: 45 s, 12 min, 3.5 h, 2.0 d."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
