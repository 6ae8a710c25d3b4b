"""The alert on-call receives: one notification about one group, as stored in the outbox."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from logstream.alerts.config import Link, rfc3339
from logstream.alerts.grouping import Group
from logstream.alerts.links import link_variables, render_links

__all__ = ["Alert", "rfc3339", "shallow_dict"]

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
    model_id: str
    max_score: float
    threshold: float
    severity: str
    # context (defaults: rows written by older releases)
    starts_at: float = 0.0  # the incident's first log time (else when it was seen), unix s
    template_text: str = ""
    location: str = ""  # topic/partition@offset or path:line of the first anomaly
    context_before: list[str] | tuple[str, ...] = ()
    context_after: list[str] | tuple[str, ...] = ()
    model_version: str = ""
    examples: list[str] | tuple[str, ...] = ()  # first line of each distinct alert
    links: list[tuple[str, str]] | tuple[tuple[str, str], ...] = ()  # (name, url)
    explanation: str = ""  # why its first line scored high, in words (replay's table says the same)
    # the past incidents most like this one, best first (`PastIncident.to_json`: time, verdicts,
    # resolution ...), as the incident memory found them when the notification was made
    past_incidents: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(
        cls,
        group: Group,
        status: str,
        resolve_timeout: float,
        links: Sequence[Link] = (),
        past_incidents: Sequence[dict[str, Any]] = (),
    ) -> Alert:
        # log time, but never after we saw it (a producer's clock ahead would put startsAt
        # after endsAt, which Alertmanager refuses)
        starts = min(group.event_time, group.first_seen) if group.event_time else group.first_seen
        last = group.last_event_time or group.last_seen
        labels = dict(group.labels)
        values = {
            "stream": labels.get("stream", ""), "severity": group.severity,
            "template": labels.get("template", ""), "template_text": group.template_text,
            "source": group.location, "model_id": group.model_id, "receiver": group.receiver,
            "dedup_key": group.dedup_key,
        }  # fmt: skip
        variables = link_variables(values, labels, starts, max(last, starts))
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
            model_id=group.model_id,
            max_score=group.max_score,
            threshold=group.threshold,
            severity=group.severity,
            starts_at=starts,
            template_text=group.template_text,
            location=group.location,
            context_before=list(group.context_before),
            context_after=list(group.context_after),
            model_version=group.model_version,
            examples=list(group.examples),
            links=render_links(links, group.runbook_url, variables),
            explanation=group.explanation,
            past_incidents=list(past_incidents),
        )

    @property
    def stream(self) -> str:
        return self.labels.get("stream", "")

    @property
    def summary(self) -> str:
        """One line: what, where, how many (PagerDuty's summary, Slack's fallback text)."""
        line = self.first_line.strip().split("\n", 1)[0]  # a multi-line event: its head line
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
        data.pop("top_tokens", None)  # BPE tokens, in rows that have them: `explanation` says it in words
        data["links"] = [(str(n), str(u)) for n, u in data.get("links", ())]
        data.setdefault("starts_at", data["first_seen"])
        return cls(**data)


def shallow_dict(obj: object) -> dict[str, Any]:
    """A dataclass's fields as a dict without `asdict`'s deep copy (hot path: every alert)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}  # type: ignore[arg-type]
