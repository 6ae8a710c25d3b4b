"""Shared pieces of the alert tests: anomalies, routes files, a settable clock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml

from logstream.alerts.__main__ import main
from logstream.alerts.routing import template_hash
from logstream.records import Anomaly


def alerts_cli(args: Sequence[str]) -> int:
    """`python -m logstream.alerts ARGS` in this process; its exit status. The CLI points log
    lines at this test's (captured) stderr: the defaults come back for the next test."""
    try:
        return main(args)
    finally:
        structlog.reset_defaults()


class FakeClock:
    """A clock the test moves by hand, so grouping timers need no sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def template_text(template_id: int) -> str:
    """The template text of test template `template_id` (grouping keys on the text)."""
    return f"ERROR disk <PATH> failed with <*> (case {template_id})"


def template_label(template_id: int) -> str:
    """The `template` label alerts carry for test template `template_id`."""
    return template_hash(template_text(template_id))


def anomaly(
    stream: str = "prod-api",
    template_id: int = 7,
    line: str = "ERROR disk /dev/sda1 failed with 500",
    severity: str = "critical",
    score: float = 9.0,
    detected_at: float = 0.0,
    **fields: Any,
) -> Anomaly:
    """An anomaly of test template `template_id` (distinct ids: distinct template texts);
    `fields` sets any other Anomaly field (labels, event_time, context ...)."""
    return Anomaly(
        stream=stream,
        line=line,
        score=score,
        threshold=4.0,
        surprisal=score,
        severity=severity,
        level="error",
        template_id=template_id,
        template=template_text(template_id),
        top_tokens=(("failed", 8.5), ("sda1", 6.0)),
        explanation="the model's chance of 'failed' here: 1 in 4,914; 'sda1' here: 1 in 403",
        source="test",
        offset=1,
        model_id="tiny-test-model",
        detected_at=detected_at,
        **fields,
    )


def write_routes(tmp_path: Path, receivers: list[dict[str, Any]], **top: Any) -> Path:
    """A routes file: one root route to the first receiver, fast timers, tiny backoff.

    Groups are per stream *and template* here, so that these tests' distinct templates are
    distinct alerts; the default grouping (by stream) has its own tests."""
    doc: dict[str, Any] = {
        "global": {"resolve_timeout": "10m"},
        "route": {
            "receiver": receivers[0]["name"],
            "group_by": ["stream", "template"],
            "group_wait": "0s",
            "group_interval": "1m",
            "repeat_interval": "1h",
        },
        "receivers": receivers,
        "delivery": {
            "outbox": str(tmp_path / "outbox.sqlite"),
            "backoff": {"base": "20ms", "factor": 2, "max": "200ms", "jitter": 0.5},
            "min_retry_delay": "10ms",  # the backoff's own floor (20ms x (1 - jitter))
            "poll_interval": "20ms",
            "synchronous": "normal",
        },
    }
    for name, value in top.items():
        doc[name] = value if not isinstance(value, dict) else {**doc.get(name, {}), **value}
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def webhook(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "webhook_configs": [{"url": url + "/hook", "timeout": "10s", **extra}]}
