"""A shadow model: a candidate scored on the same records as the live model, which never pages.

Serve (`model.shadow`, a store version) scores each batch with the live detector, hands the
live anomalies to the sink, then scores the same records with the shadow. The shadow's
anomalies go nowhere but to metrics and the audit log (`"shadow": true`): no sink, no
outbox, no receiver. Per role (`live`, `shadow`) it exports lines flagged and would-be
alerts, plus the lines both flagged, so a promotion can be judged on live traffic:

    logstream_model_flagged_lines_total{role}   lines over the threshold (feedback applied)
    logstream_model_would_alert_total{role}     distinct (stream, template) flagged per batch:
                                                the alert pipeline's unit before grouping timers
    logstream_shadow_overlap_lines_total        lines flagged by both

`compare` reads the same from the audit log afterwards (`logstream models compare`), over
a time range, and checks the promotion gate: the candidate's alert rate at most
`max_rate_ratio` times the live one's, and every operator-confirmed anomaly template flagged.

A shadow never takes serve down: one that does not load at start (`Shadow.open`), or that
raises while scoring a batch, is logged (`shadow_dropped`, with the stage and the reason),
counted in `logstream_shadow_failures_total{stage}` and dropped; the live model goes on.

Cost: the shadow doubles the scoring work of each batch (it runs on the same thread, after
the live model's hand-off, so it never delays an alert, but it does delay the commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from logstream.detector import Detector, ScoredLine
from logstream.lifecycle.feedback import audit_entries, covers
from logstream.lifecycle.follower import load_version, reason
from logstream.metrics import MODEL_FLAGGED, MODEL_WOULD_ALERT, SHADOW_FAILURES, SHADOW_OVERLAP
from logstream.records import LogRecord

log = structlog.get_logger(__name__)


def _would_alert(scored: Sequence[ScoredLine]) -> int:
    return len({(s.record.stream, s.template) for s in scored if s.is_anomaly})


def count_live(scored: Sequence[ScoredLine]) -> None:
    MODEL_FLAGGED.labels(role="live").inc(sum(s.is_anomaly for s in scored))
    MODEL_WOULD_ALERT.labels(role="live").inc(_would_alert(scored))


class Shadow:
    """The candidate's detector, scored after the live one on the same records."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector

    @classmethod
    def open(cls, store: Path, version: str, options: dict[str, Any]) -> Shadow | None:
        """The shadow of a store version (checked as a live one is: `load_version`), or None
        when it does not load: counted, logged, and serve runs without a shadow."""
        try:
            return cls(load_version(store, version, options))
        except Exception as exc:  # a candidate that does not load must not stop the live model
            SHADOW_FAILURES.labels(stage="load").inc()
            log.error("shadow_dropped", version=version, stage="load", reason=reason(exc))
            return None

    def score(self, records: Sequence[LogRecord], live: Sequence[ScoredLine]) -> list[ScoredLine] | None:
        """The shadow's scored lines for `records` (`live`: the live model's, in the same order);
        None when it failed to score them (counted, logged): the caller drops it."""
        try:
            scored = self.detector.score(records)
        except Exception as exc:  # the candidate's failure is its own: the live model goes on
            SHADOW_FAILURES.labels(stage="score").inc()
            log.error("shadow_dropped", model_id=self.detector.model_id, stage="score", reason=reason(exc))
            return None
        MODEL_FLAGGED.labels(role="shadow").inc(sum(s.is_anomaly for s in scored))
        MODEL_WOULD_ALERT.labels(role="shadow").inc(_would_alert(scored))
        SHADOW_OVERLAP.inc(sum(a.is_anomaly and b.is_anomaly for a, b in zip(live, scored, strict=False)))
        return scored


@dataclass
class ModelTally:
    lines: int = 0
    flagged: int = 0
    flagged_at: set[tuple[str, int]] = field(default_factory=set)  # (source, offset)
    templates: set[str] = field(default_factory=set)  # templates it flagged
    shadow: bool = False  # scored as the shadow (a candidate)

    @property
    def per_10k(self) -> float:
        return 1e4 * self.flagged / self.lines if self.lines else 0.0


def tally(audit_log: Path, since: float | None = None, until: float | None = None) -> dict[str, ModelTally]:
    """Per model id, what the audit log says it scored and flagged in [since, until)."""
    out: dict[str, ModelTally] = {}
    for entry in audit_entries(audit_log):
        if entry.get("kind") != "line":
            continue
        at = entry.get("at")
        if isinstance(at, int | float) and (
            (since is not None and at < since) or (until is not None and at >= until)
        ):
            continue
        t = out.setdefault(str(entry.get("model", "")), ModelTally())
        t.lines += 1
        t.shadow = t.shadow or bool(entry.get("shadow"))
        if entry.get("anomaly"):
            t.flagged += 1
            t.flagged_at.add((str(entry.get("source")), int(entry.get("offset") or 0)))
            t.templates.add(str(entry.get("template")))
    return out


@dataclass(frozen=True)
class Gate:
    """The promotion gate's verdict and its two checks."""

    rate_ratio: float  # candidate's flagged lines per 10k over the live model's
    missed: tuple[str, ...]  # operator-confirmed anomaly templates the candidate did not flag
    max_rate_ratio: float

    @property
    def passed(self) -> bool:
        return self.rate_ratio <= self.max_rate_ratio and not self.missed


def gate(live: ModelTally, candidate: ModelTally, confirmed: Sequence[str], max_rate_ratio: float) -> Gate:
    """Candidate's alert rate at most `max_rate_ratio` x live's, and every confirmed anomaly
    template (`logstream feedback anomaly`) that the live model flagged also flagged by it."""
    ratio = (
        candidate.per_10k / live.per_10k if live.per_10k else (0.0 if not candidate.flagged else float("inf"))
    )
    seen_live = [t for t in confirmed if any(covers(t, m) for m in live.templates)]
    missed = tuple(t for t in seen_live if not any(covers(t, m) for m in candidate.templates))
    return Gate(ratio, missed, max_rate_ratio)
