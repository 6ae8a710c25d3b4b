"""The records that cross module boundaries: a log line in, a stream of lines, an anomaly out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log line from a source.

    `stream` keys the rolling cache (a host, a job, an HDFS block ...). `source`
    and `offset` say where the line came from (`topic/partition`, file path) so
    that alerts can point at it and sources can commit after hand-off.
    """

    line: str
    stream: str = "default"
    source: str = ""
    offset: int | None = None
    timestamp: float | None = None  # event time, unix seconds (a JSON field, else Kafka's)
    labels: tuple[tuple[str, str], ...] = ()  # from the record, for alert routing (input.label_*)
    source_kind: str = ""  # "kafka" (source = topic/partition) | "file" (source = path) | "stdin"
    last_offset: int | None = None  # a multi-line event (consumers.multiline): its last line's offset


@dataclass(frozen=True)
class Stream:
    """One stream's lines in order; `ended` if it closed (a session), so its end is learned."""

    name: str
    lines: list[str]
    ended: bool = False


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A scored line (or a stream end) whose score crossed the calibrated threshold.

    `kind` is "line" for a surprising line, "end" for a stream that closed or
    went quiet where the model expected more (a job that never finished), and "quiet"
    for a source of a stream that stopped logging (logstream.scoring.quiet; `line` says which).
    `score` is the surprisal in nats/token plus the level prior; `surprisal` is
    the bare model number. `top_tokens` are the most surprising BPE tokens with
    their surprisal (for tools); `explanation` says the same in words, for people.
    """

    stream: str
    line: str
    score: float
    threshold: float
    surprisal: float
    severity: str  # "warning" | "critical" (score vs threshold, see scoring.severity)
    kind: str = "line"  # "line" | "end" | "quiet"
    level: str | None = None  # log level parsed from the line, if the format has one
    template_id: int | None = None
    template: str | None = None
    top_tokens: tuple[tuple[str, float], ...] = ()
    source: str = ""
    offset: int | None = None
    model_id: str = ""
    detected_at: float = field(default_factory=time.time)
    # context for whoever is paged (all optional; see docs/alerts.md "What an alert carries")
    event_time: float | None = None  # the log's own time (the record's timestamp), unix s
    location: str = ""  # "topic/partition@offset" or "path:line" (1-based)
    context_before: tuple[str, ...] = ()  # the stream's lines just before (oldest first)
    context_after: tuple[str, ...] = ()  # the stream's next lines, when already at hand
    model_version: str = ""  # when the model was trained (logstream.json created_at)
    labels: tuple[tuple[str, str], ...] = ()  # from the record, for routing (team, namespace ...)
    # why it scored high, in words: the surprising words and the model's chance of each, as
    # replay's table says it (`explain.Explanation.summary`; alerts.context.anomalies_of)
    explanation: str = ""


def location(record: LogRecord) -> str:
    """Where a line came from, as a responder would look it up: `topic/partition@offset`
    for Kafka, `path:line` (1-based, as an editor counts) for a file, else the source; a
    multi-line event names its range (`path:12-40`, `topic/0@7-9`)."""
    if record.offset is None:
        return record.source
    last = record.last_offset
    if record.source_kind == "kafka":
        return f"{record.source}@{record.offset}" + (f"-{last}" if last is not None else "")
    if record.source_kind in ("file", "stdin"):
        return f"{record.source}:{record.offset + 1}" + (f"-{last + 1}" if last is not None else "")
    return f"{record.source}#{record.offset}" if record.source else ""
