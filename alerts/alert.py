"""The alert on-call receives: one notification about one group, as stored in the outbox."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from logstream.alerts.grouping import Group

SUMMARY_LINE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Alert:
    """A snapshot of a group at notification time; channels render it, nothing else.

    `dedup_key` is the same for every notification of one incident;
    `sequence` numbers the notifications, so (dedup_key, sequence, channel)
    is the delivery's idempotency key.
    """

    status: str  # "firing" | "resolved"
    receiver: str
    dedup_key: str
    sequence: int
    labels: dict[str, str]
    group_labels: dict[str, str]
    count: int
    distinct: int
    first_line: str
    last_line: str
    first_seen: float
    last_seen: float
    notified_at: float
    ended_at: float | None
    top_tokens: list[tuple[str, float]]
    model_id: str
    max_score: float
    threshold: float
    severity: str

    @classmethod
    def of(cls, group: Group, status: str, resolve_timeout: float) -> Alert:
        return cls(
            status=status,
            receiver=group.receiver,
            dedup_key=group.dedup_key,
            sequence=group.sequence,
            labels=dict(group.labels),
            group_labels=dict(group.group_labels),
            count=group.count,
            distinct=len(group.fingerprints),
            first_line=group.first_line,
            last_line=group.last_line,
            first_seen=group.first_seen,
            last_seen=group.last_seen,
            notified_at=group.last_notified or group.last_seen,
            ended_at=group.last_seen + resolve_timeout if status == "resolved" else None,
            top_tokens=[(t, s) for t, s in group.top_tokens],
            model_id=group.model_id,
            max_score=group.max_score,
            threshold=group.threshold,
            severity=group.severity,
        )

    @property
    def stream(self) -> str:
        return self.labels.get("stream", "")

    @property
    def summary(self) -> str:
        """One line: what, where, how many (PagerDuty's summary, Slack's fallback text)."""
        line = self.first_line.strip()
        if len(line) > SUMMARY_LINE_CHARS:
            line = line[: SUMMARY_LINE_CHARS - 1] + "…"
        lines = "line" if self.count == 1 else "lines"
        prefix = "[RESOLVED] " if self.status == "resolved" else ""
        return f"{prefix}{self.stream}: {self.count} anomalous log {lines}, first: {line}"

    def to_json(self) -> str:
        return json.dumps(shallow_dict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Alert:
        data: dict[str, Any] = json.loads(text)
        data["top_tokens"] = [(str(t), float(s)) for t, s in data["top_tokens"]]
        return cls(**data)


def shallow_dict(obj: object) -> dict[str, Any]:
    """A dataclass's fields as a dict without `asdict`'s deep copy (hot path: every alert)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}  # type: ignore[arg-type]


def rfc3339(ts: float) -> str:
    """Unix seconds -> '2026-11-29T17:00:00.000Z' (what PagerDuty and Alertmanager accept)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
