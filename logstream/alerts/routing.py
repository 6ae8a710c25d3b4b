"""Which receivers an anomaly goes to, and which group (incident) it joins.

Matching follows Alertmanager: a node matches when all its `match` globs,
`matchers` (and `min_score`) hold; its children are then tried in order; the
first matching child wins unless it says `continue: true`; a node none of
whose children match handles the anomaly itself. Timers, `group_by` and
`runbook_url` inherit downwards. `group_by: ['...']` groups by every label.

The default grouping is by stream: one incident per stream until it has been
quiet for `resolve_timeout`, so a burst of different lines (an OOM kill, then
an EXT3 error, then a read-only remount) is one alert listing all three, not
three pages.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from logstream.alerts.config import ALL_LABELS, AlertsConfig, Route
from logstream.alerts.matchers import matches
from logstream.records import Anomaly

DEFAULT_GROUP_BY = ("stream",)
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Timing:
    """Alertmanager's three grouping timers, in seconds."""

    group_wait: float = 30.0
    group_interval: float = 300.0
    repeat_interval: float = 14400.0


@dataclass(frozen=True, slots=True)
class Match:
    """A resolved route: where the anomaly goes and how its group is timed."""

    receiver: str
    group_by: tuple[str, ...]
    timing: Timing
    runbook_url: str | None = None


def template_label(anomaly: Anomaly) -> str:
    """A short hash of the template text (else the line with digits masked).

    Never the miner's `template_id`: group keys, fingerprints and dedup keys are built
    from this label, and they must mean the same template in every process (miner ids
    restarted from 1 per process, so a new incident could fold into an old one)."""
    text = anomaly.template or _DIGITS.sub("0", anomaly.line)
    return template_hash(text)


def template_hash(text: str) -> str:
    """sha256 of the text, 12 hex digits: stable across processes and Python hash seeds."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def anomaly_labels(anomaly: Anomaly) -> dict[str, str]:
    """The labels routes and silences see (`template`: see `template_label`): the built-in
    ones, then those taken from the record (which may not replace a built-in one)."""
    return {
        **dict(anomaly.labels),
        "stream": anomaly.stream,
        "severity": anomaly.severity,
        "kind": anomaly.kind,
        "level": anomaly.level or "",
        "template": template_label(anomaly),
        "source": anomaly.source,
        "model_id": anomaly.model_id,
    }


def route(config: AlertsConfig, labels: Mapping[str, str], score: float) -> list[Match]:
    """Receivers (with grouping) for one anomaly; the root always matches."""
    root = config.route
    inherited = Match(
        receiver=root.receiver or "",
        group_by=tuple(root.group_by or DEFAULT_GROUP_BY),
        timing=_timing(root, Timing()),
        runbook_url=root.runbook_url,
    )
    return _children(root, inherited, labels, score) or [inherited]


def _children(node: Route, here: Match, labels: Mapping[str, str], score: float) -> list[Match]:
    out: list[Match] = []
    for child in node.routes:
        if not matches(child.all_matchers, labels):
            continue
        if child.min_score is not None and score < child.min_score:
            continue
        resolved = Match(
            receiver=child.receiver or here.receiver,
            group_by=tuple(child.group_by) if child.group_by is not None else here.group_by,
            timing=_timing(child, here.timing),
            runbook_url=child.runbook_url if child.runbook_url is not None else here.runbook_url,
        )
        out += _children(child, resolved, labels, score) or [resolved]
        if not child.continue_:
            break
    return out


def _timing(node: Route, parent: Timing) -> Timing:
    return Timing(
        group_wait=parent.group_wait if node.group_wait is None else node.group_wait,
        group_interval=(parent.group_interval if node.group_interval is None else node.group_interval),
        repeat_interval=(parent.repeat_interval if node.repeat_interval is None else node.repeat_interval),
    )


def grouped_labels(match: Match, labels: Mapping[str, str]) -> dict[str, str]:
    """The `group_by` labels' values (every label for `['...']`)."""
    if match.group_by == (ALL_LABELS,):
        return dict(labels)
    return {name: labels.get(name, "") for name in match.group_by}


def group_key(match: Match, labels: Mapping[str, str]) -> str:
    """Stable text key of a group: receiver plus the `group_by` label values."""
    grouped = grouped_labels(match, labels)
    return match.receiver + ":" + json.dumps(grouped, sort_keys=True, separators=(",", ":"))


def fingerprint(labels: Mapping[str, str]) -> str:
    """One distinct alert inside a group: its stream and template."""
    return labels["stream"] + "\x00" + labels["template"]
