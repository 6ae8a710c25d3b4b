"""Multi-line events: the lines of one stack trace joined into one record.

Java and Python write one exception as many lines. Scored line by line, every `at ...`
frame is a record of its own: one incident becomes dozens of lines and its explanation
lands on a frame. Every log shipper joins them first (Fluent Bit's multiline parsers,
Filebeat's `multiline`, Vector, promtail); so does this, on files and stdin (replay, tail,
train) and, when `input.multiline` says so, on Kafka.

Which line continues the event before it (`auto`):
- an indented line: a Java frame (`\\tat com.x.Y(Y.java:42)`), Python's `  File "x.py",
  line 3` and its code line, the wrapped rest of any message;
- Java: `Caused by: ...`, `Suppressed: ...`, `... 12 more`, `... 3 common frames
  omitted`, and an exception named at the start of a line (`java.lang.IllegalStateException:
  boom`), as logback and log4j write it under the message that logged it;
- Python: `Traceback (most recent call last):`, the sentences that chain two tracebacks
  (`During handling of the above exception, another exception occurred:`, `The above
  exception was the direct cause of the following exception:`) and, inside a traceback,
  the exception line that ends it (`KeyError: 'id'`).
`Exception in thread "main" java.lang...` is a head (an event starts there), not a
continuation. `start` and `continue` take the user's pattern instead (RE2, searched in
the line): an event starts at each line matching it, or each line matching it continues.

Per stream: the event being gathered is kept per (source, stream), so the lines of two
streams interleaved in one file or partition each join their own event. A line whose
stream key was not found (a frame rarely carries the host or request id the key reads)
continues the stream of the line before it in its source: that is who wrote it.

Records come out in the order of their first lines. An event is complete at the next line
of its stream that does not continue it, at the end of the input, or, following a file,
once no line came for `flush_seconds` (`flush`); records of other streams behind it wait
that long with it. Bounded: an event is cut at `max_lines` or `max_bytes` (the rest starts
another event, and `JoinStats.cut` counts it); at most MAX_OPEN events are gathered and
MAX_WAITING records wait, past which the oldest event is complete.

A joined record is its first line's record (stream, source, offset, event time, labels)
with the lines joined by newlines as its text and `last_offset` its last line's. The
model reads it as one line: masking turns the newlines into spaces, and of a long trace
it reads the head and the first frames (`LineTokenizer.max_line_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from logstream.metrics import MULTILINE_CUT
from logstream.records import LogRecord
from logstream.regex import compile_safe
from logstream.settings import InputSettings, MultilineSettings

MAX_OPEN = 10_000  # events being gathered at once (one per stream at most)
MAX_WAITING = 4_096  # records held behind an event that is still open

_INDENTED = compile_safe(r"^[ \t]+\S")
_JAVA = compile_safe(
    r"^[ \t]*(?:Caused by: |Suppressed: |\.\.\. \d+ (?:more|common frames omitted)$)"
    r"|^(?:[a-zA-Z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable)(?::|$)"
)
_PYTHON = compile_safe(
    r"^(?:Traceback \(most recent call last\):"
    r"|During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)$"
)
_TRACEBACK = compile_safe(r"^Traceback \(most recent call last\):$")
_PYTHON_EXCEPTION = compile_safe(r"^[A-Za-z_][\w.]*(?:: .*)?$")  # `KeyError: 'id'`, `StopIteration`


@dataclass
class JoinStats:
    """What joining did: records made of several lines, the lines in them, events cut."""

    events: int = 0
    lines: int = 0
    cut: int = 0  # events cut at max_lines or max_bytes (the rest became another event)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Joined:
    """A record as joined, and which of the pushed lines it holds (0-based, in push order)."""

    record: LogRecord
    members: tuple[int, ...]


class _Event:
    """An event being gathered: its first record, its lines, whether a traceback is open."""

    __slots__ = ("done", "head", "key", "last_offset", "lines", "members", "seen_at", "size", "traceback")

    def __init__(self, key: tuple[str, str], record: LogRecord, number: int, now: float) -> None:
        self.key, self.head, self.seen_at = key, record, now
        self.lines, self.members = [record.line], [number]
        self.size = len(record.line.encode("utf-8"))
        self.last_offset = record.offset
        self.traceback = _TRACEBACK.search(record.line) is not None
        self.done = False

    def joined(self) -> Joined:
        if len(self.lines) == 1:
            return Joined(self.head, tuple(self.members))
        record = dataclasses.replace(self.head, line="\n".join(self.lines), last_offset=self.last_offset)
        return Joined(record, tuple(self.members))


class Joiner:
    """Joins records into events, per (source, stream); see the module docstring.

    `keyed`: the records' streams come from a key (regex, JSON field, message key), so a
    record in `default_stream` is one whose key was not found."""

    def __init__(
        self,
        settings: MultilineSettings,
        *,
        keyed: bool = False,
        default_stream: str = "default",
        stats: JoinStats | None = None,
    ) -> None:
        self.settings = settings
        self.keyed, self.default_stream = keyed, default_stream
        self.stats = stats if stats is not None else JoinStats()
        self._pattern = compile_safe(settings.pattern) if settings.pattern else None
        self._open: dict[tuple[str, str], _Event] = {}  # oldest first
        self._waiting: deque[_Event] = deque()  # every event not yet handed out, by first line
        self._last: dict[str, str] = {}  # source -> the stream of its last line
        self._pushed = 0

    def push(self, record: LogRecord, now: float = 0.0) -> list[Joined]:
        """Take the next record of the input; return the records complete now, in order."""
        number, self._pushed = self._pushed, self._pushed + 1
        line = record.line
        own = self._open.get((record.source, record.stream))
        event = own
        if self.keyed and record.stream == self.default_stream:  # no key: the writer of the line before
            event = self._open.get((record.source, self._last.get(record.source, record.stream)))
        if event is not None and self._continues(event, line):
            size = event.size + 1 + len(line.encode("utf-8"))
            if len(event.lines) < self.settings.max_lines and size <= self.settings.max_bytes:
                event.lines.append(line)
                event.members.append(number)
                event.size, event.last_offset, event.seen_at = size, record.offset, now
                event.traceback = _in_traceback(event.traceback, line)
                self._note_source(record.source, event.key[1])
                return self._ready()
            self.stats.cut += 1
            MULTILINE_CUT.inc()
            self._complete(event)
            record = dataclasses.replace(record, stream=event.key[1])  # the rest of the same event
            self._start(record, number, now).traceback = _in_traceback(event.traceback, line)
        else:
            if own is not None:
                self._complete(own)
            self._start(record, number, now)
        self._note_source(record.source, record.stream)
        return self._ready()

    def flush(self, idle_since: float | None = None) -> list[Joined]:
        """Complete the open events (only those without a line since `idle_since`, if given)
        and return the records complete now, in order."""
        for event in list(self._open.values()):
            if idle_since is None or event.seen_at <= idle_since:
                self._complete(event)
        return self._ready()

    def _continues(self, event: _Event, line: str) -> bool:
        mode = self.settings.mode
        if mode == "start":
            return self._pattern is not None and self._pattern.search(line) is None
        if mode == "continue":
            return self._pattern is not None and self._pattern.search(line) is not None
        return (
            _INDENTED.search(line) is not None
            or _JAVA.search(line) is not None
            or _PYTHON.search(line) is not None
            or (event.traceback and _PYTHON_EXCEPTION.search(line) is not None)
        )

    def _start(self, record: LogRecord, number: int, now: float) -> _Event:
        event = _Event((record.source, record.stream), record, number, now)
        self._open[event.key] = event
        self._waiting.append(event)
        if len(self._open) > MAX_OPEN:
            self._complete(next(iter(self._open.values())))
        return event

    def _complete(self, event: _Event) -> None:
        event.done = True
        if self._open.get(event.key) is event:
            del self._open[event.key]
        if len(event.lines) > 1:
            self.stats.events += 1
            self.stats.lines += len(event.lines)

    def _note_source(self, source: str, stream: str) -> None:
        self._last[source] = stream
        if len(self._last) > MAX_OPEN:
            del self._last[next(iter(self._last))]

    def _ready(self) -> list[Joined]:
        out = []
        while self._waiting and (self._waiting[0].done or len(self._waiting) > MAX_WAITING):
            event = self._waiting.popleft()
            if not event.done:
                self._complete(event)
            out.append(event.joined())
        return out


def _in_traceback(inside: bool, line: str) -> bool:
    """Whether an event is inside a Python traceback once `line` joined it: from `Traceback
    (most recent call last):` through its indented frames, until the exception line."""
    if _TRACEBACK.search(line) is not None:
        return True
    return inside and _INDENTED.search(line) is not None


def joiner_for(settings: InputSettings, stats: JoinStats | None = None) -> Joiner | None:
    """The joiner that `settings.multiline` asks for, None when it is off."""
    if settings.multiline.mode == "off":
        return None
    keyed = settings.stream_key != "none"
    return Joiner(settings.multiline, keyed=keyed, default_stream=settings.default_stream, stats=stats)


def join_records(records: Iterable[LogRecord], joiner: Joiner | None) -> Iterator[LogRecord]:
    """The records as events (unchanged without a joiner), to the end of the input."""
    for joined in join_events(records, joiner):
        yield joined.record


def join_events(records: Iterable[LogRecord], joiner: Joiner | None) -> Iterator[Joined]:
    """`join_records`, each with the numbers of the lines it holds."""
    if joiner is None:
        yield from (Joined(record, (number,)) for number, record in enumerate(records))
        return
    for record in records:
        yield from joiner.push(record)
    yield from joiner.flush()


def join_batch(records: list[LogRecord], joiner: Joiner | None) -> list[LogRecord]:
    """A batch's records as events, complete at the batch's end (an event cannot wait for
    the next batch: its source's offsets are committed after this one)."""
    if joiner is None:
        return records
    out = [joined.record for record in records for joined in joiner.push(record)]
    return out + [joined.record for joined in joiner.flush()]
