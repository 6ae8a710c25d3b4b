"""The two records that cross module boundaries: a log line in, an anomaly out."""

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
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A scored line (or a stream end) whose score crossed the calibrated threshold.

    `kind` is "line" for a surprising line and "end" for a stream that closed or
    went quiet where the model expected more (a job that never finished).
    `score` is the surprisal in nats/token plus the level prior; `surprisal` is
    the bare model number. `top_tokens` are the most surprising tokens with
    their surprisal, to explain the alert.
    """

    stream: str
    line: str
    score: float
    threshold: float
    surprisal: float
    severity: str  # "warning" | "critical" (score vs threshold, see scoring.severity)
    kind: str = "line"  # "line" | "end"
    level: str | None = None  # log level parsed from the line, if the format has one
    template_id: int | None = None
    template: str | None = None
    top_tokens: tuple[tuple[str, float], ...] = ()
    source: str = ""
    offset: int | None = None
    model_id: str = ""
    detected_at: float = field(default_factory=time.time)
