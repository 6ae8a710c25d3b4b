"""Grouping: anomalies of one incident become one alert, notified on Alertmanager's timers.

A group is keyed by receiver + `group_by` labels (by default stream and
template). Its life, evaluated at `next_eval`:

- pending: the first anomaly opened it; the first notification goes out
  `group_wait` later, carrying everything that arrived meanwhile;
- firing: re-notified when a new distinct alert (stream+template) joined and
  `group_interval` passed since the last notification, or when
  `repeat_interval` passed; anomalies of alerts already notified only raise
  the count;
- resolved: no anomaly for `resolve_timeout`; a `resolved` notification goes
  out (PagerDuty `resolve`, Alertmanager `endsAt`), and the next anomaly opens
  a new incident with a new dedup key.

A silenced group is not notified (it is re-evaluated when the silence ends);
its resolve still goes out if a firing notification ever did, so that no
PagerDuty incident is left open by a silence.

These are pure functions of (group, anomaly, now): the outbox stores the
result, which is what makes grouping survive a crash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from logstream.alerts.routing import Match, Timing, fingerprint, grouped_labels
from logstream.records import Anomaly

NEVER = 1e18  # next_eval of a resolved group
MAX_FINGERPRINTS = 100  # distinct alerts remembered per group (a count keeps growing past it)
MAX_EXAMPLES = 5  # the first line of each of the first few distinct alerts, shown in the alert
_SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}


@dataclass(frozen=True, slots=True)
class Group:
    """State of one group (incident) as stored in the outbox."""

    key: str
    receiver: str
    labels: dict[str, str]  # labels of the incident's first anomaly (what silences see)
    group_labels: dict[str, str]
    timing: Timing
    # the first incident is numbered by the unix second the group opened, each resolve adds 1:
    # a group pruned after its retention and opened again never reuses a dedup key
    incident: int
    state: str  # "pending" | "firing" | "resolved"
    first_seen: float
    last_seen: float
    count: int
    first_line: str
    last_line: str
    model_id: str
    max_score: float
    threshold: float
    severity: str
    fingerprints: tuple[str, ...]
    sequence: int = 0  # notifications made in this incident
    last_notified: float | None = None
    notified_distinct: int = 0
    next_eval: float = NEVER
    # what the first anomaly says about itself (defaults: rows written by older releases)
    template_text: str = ""
    location: str = ""
    context_before: tuple[str, ...] = ()
    context_after: tuple[str, ...] = ()
    event_time: float | None = None  # the first anomaly's log time
    last_event_time: float | None = None
    model_version: str = ""
    runbook_url: str | None = None  # the route's link template
    examples: tuple[str, ...] = ()  # first line of each distinct alert (up to MAX_EXAMPLES)
    explanation: str = ""  # why the first anomaly scored high, in words (Anomaly.explanation)

    @property
    def dedup_key(self) -> str:
        """Stable per incident: PagerDuty's dedup_key, Alertmanager's fingerprint."""
        text = f"{self.key}#{self.incident}"
        return "logstream-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def absorb(
    group: Group | None,
    anomaly: Anomaly,
    labels: Mapping[str, str],
    match: Match,
    key: str,
    now: float,
) -> Group:
    """Add one anomaly to its group, opening a new incident when there is none or it resolved."""
    fp = fingerprint(labels)
    if group is None or group.state == "resolved":
        fresh = Group(
            key=key,
            receiver=match.receiver,
            labels=dict(labels),
            group_labels=grouped_labels(match, labels),
            timing=match.timing,
            incident=(group.incident + 1) if group else max(int(now), 1),
            state="pending",
            first_seen=now,
            last_seen=now,
            count=1,
            first_line=anomaly.line,
            last_line=anomaly.line,
            model_id=anomaly.model_id,
            max_score=anomaly.score,
            threshold=anomaly.threshold,
            severity=anomaly.severity,
            fingerprints=(fp,),
            template_text=anomaly.template or "",
            location=anomaly.location,
            context_before=tuple(anomaly.context_before),
            context_after=tuple(anomaly.context_after),
            event_time=anomaly.event_time,
            last_event_time=anomaly.event_time,
            model_version=anomaly.model_version,
            runbook_url=match.runbook_url,
            examples=(anomaly.line,),
            explanation=anomaly.explanation,
        )
        return replace(fresh, next_eval=now + match.timing.group_wait)
    fps, examples = group.fingerprints, group.examples
    if fp not in fps and len(fps) < MAX_FINGERPRINTS:
        fps = (*fps, fp)
        if len(examples) < MAX_EXAMPLES:
            examples = (*examples, anomaly.line)
    merged = replace(
        group,
        examples=examples,
        last_event_time=_latest(group.last_event_time, anomaly.event_time),
        last_seen=max(group.last_seen, now),
        count=group.count + 1,
        last_line=anomaly.line,
        model_id=anomaly.model_id or group.model_id,
        max_score=max(group.max_score, anomaly.score),
        severity=max(group.severity, anomaly.severity, key=lambda s: _SEVERITY_RANK.get(s, 0)),
        fingerprints=fps,
    )
    if merged.state == "firing":
        merged = replace(merged, next_eval=_next_eval_firing(merged, resolve_timeout=None))
    return merged


def evaluate(
    group: Group,
    now: float,
    resolve_timeout: float,
    silenced_until: float | None,
    *,
    early: bool = False,
) -> tuple[Group, str | None]:
    """Advance a due group; returns the new state and "firing"/"resolved" when it notifies.

    `early` cuts a pending group's `group_wait` short (shutdown: notify what we have)."""
    quiet_at = group.last_seen + resolve_timeout
    if group.state == "resolved":
        return replace(group, next_eval=NEVER), None
    if group.state == "firing" and now >= quiet_at:
        return _notified(replace(group, state="resolved"), now, NEVER), "resolved"
    if group.state == "pending" and now < group.first_seen + group.timing.group_wait and not early:
        return replace(group, next_eval=group.first_seen + group.timing.group_wait), None
    changed = group.state == "pending" or (
        len(group.fingerprints) > group.notified_distinct
        and now >= (group.last_notified or 0.0) + group.timing.group_interval
    )
    repeat = group.last_notified is not None and (now >= group.last_notified + group.timing.repeat_interval)
    if silenced_until is not None and (changed or repeat):
        if group.state == "pending" and now >= quiet_at:  # muted for its whole life
            return replace(group, state="resolved", next_eval=NEVER), None
        return replace(group, next_eval=min(silenced_until, quiet_at)), None
    if changed or repeat:
        firing = replace(group, state="firing", notified_distinct=len(group.fingerprints))
        notified = _notified(firing, now, 0.0)
        return replace(notified, next_eval=_next_eval_firing(notified, resolve_timeout)), "firing"
    return replace(group, next_eval=_next_eval_firing(group, resolve_timeout)), None


def _latest(held: float | None, new: float | None) -> float | None:
    return new if held is None else held if new is None else max(held, new)


def _notified(group: Group, now: float, next_eval: float) -> Group:
    return replace(group, sequence=group.sequence + 1, last_notified=now, next_eval=next_eval)


def _next_eval_firing(group: Group, resolve_timeout: float | None) -> float:
    """Earliest moment something can change: a resolve, a repeat, or a pending update.

    `resolve_timeout=None` (on absorb) leaves the resolve check to the current next_eval."""
    last = group.last_notified or group.first_seen
    times = [last + group.timing.repeat_interval]
    if resolve_timeout is not None:
        times.append(group.last_seen + resolve_timeout)
    else:
        times.append(group.next_eval)
    if len(group.fingerprints) > group.notified_distinct:
        times.append(last + group.timing.group_interval)
    return min(times)
