"""`logstream tail FILE... | -`: serve's pipeline without Kafka, on files or stdin.

Each input has a reader thread (`consumers.file.read_file`, following the
file through rotation and truncation, or `consumers.stdin.read_stdin`). A
followed file is read from its end, as `tail -F` does (only what is written
from now on; `from_start` reads what it holds first); stdin from its start.
All inputs go through one `RecordParser`, so bad lines are counted and skipped
exactly as serve counts Kafka messages. Records get their event time from
the start of their line (`event_time`), then queue up for the main thread,
which joins multi-line events (`consumers.multiline`, per source and stream;
an event is complete once its stream writes a line that does not continue
it, or after `flush_seconds` without one), scores what has arrived as one
batch, prints each anomaly (for a person, with control characters escaped:
`printable`; or `--json` lines) and hands them to the alert sink. With the alert sink, the
first anomaly printed of each incident is followed by the past incidents most like it
(`seen before:`, from the sink's incident memory, as the incident's alert will carry them).

The model is a directory, or a model store followed as serve follows it
(`live_model.ModelFollower`): between two batches, a promote or rollback
switches to the new live version.

Stopping: SIGINT/SIGTERM stop the readers; what was already read is scored,
then the alert sink is closed as serve closes it (groups in `group_wait` are
notified, delivery gets its grace period, the rest stays durable in the
outbox). Without SIGINT the run ends when every reader has ended: at EOF for
stdin and, with `once`, for files (a followed file never ends on its own).
The queue is bounded, so a fast writer waits for the model (backpressure);
a file offset is not saved, so a restarted tail reads its files again.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import structlog

from logstream.alerts import past
from logstream.alerts.alert import rfc3339
from logstream.alerts.context import LineContext, anomalies_of
from logstream.alerts.pipeline import AlertSink
from logstream.alerts.sink import AnomalySink
from logstream.consumers.file import read_file
from logstream.consumers.inputs import STDIN, line_parser
from logstream.consumers.multiline import JoinStats, joiner_for
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.consumers.stdin import read_stdin
from logstream.detector import Detector
from logstream.lifecycle.follower import ModelFollower
from logstream.records import Anomaly, LogRecord
from logstream.scoring.quiet import QuietWatch
from logstream.settings import InputSettings, MultilineSettings
from logstream.text.event_time import with_event_time
from logstream.text.printable import printable

log = structlog.get_logger(__name__)

QUEUE_RECORDS = 4096  # records read but not yet scored (readers wait beyond it)
MAX_BATCH = 256  # records scored together at most (serve's kafka.max_poll_records default)
POLL_SECONDS = 0.2  # how often a waiting loop looks at the stop flag
SHOWN_INCIDENTS = 4096  # incidents whose past ones were printed (the oldest forgotten first)


@dataclass(frozen=True)
class TailOptions:
    """What `logstream tail` reads and how. `inputs`: paths, or `-` for stdin (at most once)."""

    inputs: Sequence[str]
    stream_regex: str | None = None  # None: every line in the "default" stream
    once: bool = False  # files: read to their end and stop instead of following
    from_start: bool = False  # followed files: read what they hold first (else from their end)
    json_output: bool = False
    poll_seconds: float = 0.25  # a followed file's check for new lines / rotation
    max_message_bytes: int = field(default=InputSettings().max_message_bytes)
    quiet_sources: bool = True  # watch for sources that stop logging (serve's `quiet_sources`)
    multiline: MultilineSettings = field(default_factory=MultilineSettings)  # the CLI's default: auto


@dataclass
class TailStats:
    lines: int = 0  # records scored (a multi-line event is one)
    anomalies: int = 0
    rejects: list[RejectLog] = field(default_factory=list)  # one per input (each has its thread)
    joins: JoinStats = field(default_factory=JoinStats)

    def summary(self) -> str:
        """One line for stderr at the end: lines scored, anomalies, bad lines by kind, joined events."""
        bad: dict[str, int] = {}
        for rejects in self.rejects:
            for kind, n in rejects.counts.items():
                if n:
                    bad[kind] = bad.get(kind, 0) + n
        skipped = ", ".join(f"{kind}={n}" for kind, n in bad.items()) or "none"
        joins = self.joins
        joined = (
            f", {joins.events} multi-line events of {joins.lines} lines ({joins.cut} cut)"
            if joins.events
            else ""
        )
        return f"tail: {self.lines} lines scored, {self.anomalies} anomalies, bad lines skipped: {skipped}{joined}"


def start_line(options: TailOptions, detector: Detector, model: str) -> str:
    """What tail is about to do, for stderr: its inputs and where each starts, the model, the
    threshold, how events are joined."""
    where = (
        "from its start" if options.from_start or options.once else "from its end; --from-start reads it all"
    )
    inputs = ", ".join(
        "stdin (from its start)" if name == STDIN else f"{name} ({where})" for name in options.inputs
    )
    verb = "reading" if options.once else "following"
    joining = options.multiline.mode + (f":{options.multiline.pattern}" if options.multiline.pattern else "")
    rate = 10**-detector.threshold
    return printable(
        f"tail: {verb} {inputs}; model {model} ({detector.model_id}, trained {detector.meta.get('created_at', '?')}); "
        f"alerts above score {detector.threshold:.2f} (a normal line scores that high once in {1 / rate:,.0f}); "
        f"multi-line events: {joining}" + ("" if options.once else "; Ctrl-C stops")
    )


class _End:
    """Queued by a reader when its input has ended (or failed)."""


def format_anomaly(anomaly: Anomaly) -> str:
    """For a person: when (the log's time if it has one), severity, score, where, the line;
    a multi-line event's further lines below it, indented. Control characters are escaped
    (`printable`): the line is the log writer's text, and the terminal must not obey it."""
    when = rfc3339(anomaly.event_time if anomaly.event_time is not None else anomaly.detected_at)
    where = anomaly.location or anomaly.source
    head, *rest = anomaly.line.split("\n")
    return printable(
        f"{when} {anomaly.severity:<8} score {anomaly.score:.2f} > {anomaly.threshold:.2f} "
        f"{anomaly.stream} {where}: {head}"
    ) + "".join("\n    " + printable(line) for line in rest)


def anomaly_json(anomaly: Anomaly, past_incidents: Sequence[dict[str, Any]] = ()) -> str:
    """One JSON line per anomaly: every field of `Anomaly` (as serve's `JsonlSink` writes it),
    and `past_incidents` when it has some."""
    fields = asdict(anomaly)
    if past_incidents:
        fields["past_incidents"] = list(past_incidents)
    return json.dumps(fields)


def format_past(past_incidents: Sequence[dict[str, Any]]) -> str:
    """The lines under an anomaly that say what happened before: one per past incident."""
    return "".join("\n    " + printable(line) for line in past.seen_before(past_incidents))


class SeenBefore:
    """The past incidents of the alert sink's memory, for the first anomaly printed of each
    incident (later ones of the same incident print none)."""

    def __init__(self, sink: AlertSink) -> None:
        self.sink = sink
        self._shown: OrderedDict[str, None] = OrderedDict()

    def __call__(self, anomaly: Anomaly) -> tuple[dict[str, Any], ...]:
        fingerprint = self.sink.incident_of(anomaly)
        if fingerprint is None or fingerprint in self._shown:
            return ()
        self._shown[fingerprint] = None
        if len(self._shown) > SHOWN_INCIDENTS:
            self._shown.popitem(last=False)
        return self.sink.past_incidents(fingerprint)


def run_tail(
    options: TailOptions,
    detector: Detector,
    out: TextIO,
    sink: AnomalySink | None = None,
    stop: threading.Event | None = None,
    follower: ModelFollower | None = None,
) -> TailStats:
    """Score the inputs until they end or `stop` is set (SIGINT/SIGTERM set it when this runs
    in the main thread); print anomalies to `out`, hand them to `sink`, then close the sink.
    With a `follower` (a model store), a new live version takes over between two batches."""
    stop = stop or threading.Event()
    stats = TailStats()
    parser = line_parser(options.stream_regex, options.max_message_bytes, options.multiline)
    joiner = joiner_for(parser.settings, stats.joins)
    flush_seconds = options.multiline.flush_seconds
    records: queue.Queue[LogRecord | _End] = queue.Queue(QUEUE_RECORDS)
    stats.rejects = [RejectLog() for _ in options.inputs]
    readers = [
        threading.Thread(
            target=_read, args=(_source(name, options, parser, rejects, stop), records, stop),
            name=f"logstream-tail-{name}", daemon=True,  # stdin blocks in read(): never joined
        )
        for name, rejects in zip(options.inputs, stats.rejects, strict=True)
    ]  # fmt: skip
    restore = _on_signals(stop)
    context = LineContext()
    watch = QuietWatch() if options.quiet_sources else None  # sources that stop logging, as serve
    seen = None
    if isinstance(sink, AlertSink):
        sink.embed_with(lambda: detector)  # the incidents' vectors: the live model's
        seen = SeenBefore(sink)

    def score(batch: list[LogRecord], final: bool = False) -> None:
        nonlocal detector
        if joiner is not None:
            now = time.monotonic()
            joined = [j for record in batch for j in joiner.push(record, now)]
            joined += joiner.flush(None if final else now - flush_seconds)
            batch = [j.record for j in joined]
        if follower is not None:
            detector = follower.poll(detector) or detector
        _score(batch, detector, context, watch, out, sink, stats, options.json_output, seen)

    try:
        for reader in readers:
            reader.start()
        running = len(readers)
        while running and not stop.is_set():
            batch, ended = _next_batch(records, stop)
            running -= ended
            score(batch)
        stop.set()  # readers still following a file end now
        for _ in range(QUEUE_RECORDS // MAX_BATCH + 1):  # read before the stop: scored, not dropped
            leftover, _ = _next_batch(records, None)
            if not leftover:
                break
            score(leftover)
        score([], final=True)  # the events still being gathered
    finally:
        restore()
        if sink is not None:
            sink.close()  # as serve: notify groups in group_wait, deliver within the grace
    return stats


def _source(
    name: str, options: TailOptions, parser: RecordParser, rejects: RejectLog, stop: threading.Event
) -> Iterator[LogRecord]:
    if name == STDIN:
        return read_stdin(parser, rejects)
    return read_file(
        Path(name), parser, rejects, follow=not options.once, from_end=not options.from_start,
        poll_seconds=options.poll_seconds, stop=stop,
    )  # fmt: skip


def _read(source: Iterator[LogRecord], records: queue.Queue[LogRecord | _End], stop: threading.Event) -> None:
    """Reader thread: queue the source's records (waiting while the queue is full), then `_End`."""
    try:
        for record in with_event_time(source):
            while not _put(records, record):
                if stop.is_set():
                    return
            if stop.is_set():
                return
    except OSError as exc:  # a file that vanished or cannot be read: this input ends, others go on
        log.error("input_failed", error=str(exc))
    finally:
        while not _put(records, _End()) and not stop.is_set():
            pass  # the queue is full: the end must not be lost (the run waits for it)


def _put(records: queue.Queue[LogRecord | _End], item: LogRecord | _End) -> bool:
    """Queue `item`, waiting up to POLL_SECONDS for room; False when there was none."""
    try:
        records.put(item, timeout=POLL_SECONDS)
    except queue.Full:
        return False
    return True


def _next_batch(
    records: queue.Queue[LogRecord | _End], stop: threading.Event | None
) -> tuple[list[LogRecord], int]:
    """What has arrived (at most MAX_BATCH records), waiting up to POLL_SECONDS for the first when
    `stop` is given; and how many readers ended meanwhile."""
    batch: list[LogRecord] = []
    ended = 0
    wait = stop is not None
    while len(batch) < MAX_BATCH:
        try:
            item = (
                records.get(timeout=POLL_SECONDS)
                if wait and not batch and not ended
                else records.get_nowait()
            )
        except queue.Empty:
            break
        if isinstance(item, _End):
            ended += 1
        else:
            batch.append(item)
    return batch, ended


def _score(
    batch: list[LogRecord],
    detector: Detector,
    context: LineContext,
    watch: QuietWatch | None,
    out: TextIO,
    sink: AnomalySink | None,
    stats: TailStats,
    json_output: bool,
    seen: SeenBefore | None = None,
) -> None:
    if not batch:
        return
    step = detector.step(batch, watch)
    anomalies = anomalies_of(detector, context, step.lines + step.quiet)
    stats.lines += len(batch)
    stats.anomalies += len(anomalies)
    if sink is not None:
        sink.put(anomalies)
    for anomaly in anomalies:
        found = seen(anomaly) if seen is not None else ()
        text = anomaly_json(anomaly, found) if json_output else format_anomaly(anomaly) + format_past(found)
        out.write(text + "\n")
    out.flush()


def _on_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGINT and SIGTERM set `stop` (main thread only); returns what restores the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    old = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for signum, previous in old.items():
            signal.signal(signum, previous)

    return restore
