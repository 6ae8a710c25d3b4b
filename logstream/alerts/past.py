"""Past incidents as an alert carries them, in words: for the channels, `tail` and the report.

An alert's `past_incidents` are `PastIncident.to_json` objects (logstream.memory.retrieval):
fingerprint, similarity, starts_at, streams, verdicts [{verdict, comment, by, at}],
resolution, resolved_by, and `url` when the memory has a link template. Each function
here gives one short piece of text ("" when the incident has none of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from logstream.alerts.config import rfc3339

Past = Mapping[str, Any]


def headline(past: Past) -> str:
    """When it began, which incident, how alike, where:
    `2026-11-02T08:00:01.393Z logstream-21d7... (similarity 0.91, prod-api)`."""
    streams = ", ".join(past.get("streams") or ())
    where = f", {streams}" if streams else ""
    return f"{rfc3339(past.get('starts_at') or 0.0)} {past.get('fingerprint', '')} (similarity {past.get('similarity', 0.0):.2f}{where})"


def verdicts(past: Past) -> str:
    """What operators said: `anomaly "real: disk filled by the backup job" (bob)`, each."""
    said = []
    for v in past.get("verdicts") or ():
        comment = f' "{v["comment"]}"' if v.get("comment") else ""
        by = f" ({v['by']})" if v.get("by") else ""
        said.append(f"{v.get('verdict', '')}{comment}{by}")
    return "; ".join(said)


def resolution(past: Past) -> str:
    """What was done: `moved the backup's staging dir off /var (alice)`."""
    text = past.get("resolution") or ""
    if not text:
        return ""
    return f"{text} ({past['resolved_by']})" if past.get("resolved_by") else text


def describe(past: Past) -> str:
    """All of it in one line, as `tail` prints it under an anomaly."""
    parts = [headline(past)]
    if said := verdicts(past):
        parts.append(f"verdict: {said}")
    if done := resolution(past):
        parts.append(f"resolution: {done}")
    if past.get("url"):
        parts.append(str(past["url"]))
    return "; ".join(parts)


def seen_before(past_incidents: Sequence[Past]) -> list[str]:
    """`seen before: ...`, one line per past incident, as `tail` and replay print them under
    an anomaly or an alert (for a terminal, pass each through `printable`)."""
    return [f"seen before: {describe(p)}" for p in past_incidents]
