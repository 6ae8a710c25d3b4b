"""Channels: render an Alert into the request each service documents. No I/O here.

- webhook: Alertmanager's webhook payload (version "4"), the de-facto generic
  alert JSON: https://prometheus.io/docs/alerting/latest/configuration/#webhook_config
- slack: incoming webhook, `text` (fallback) plus Block Kit `blocks`:
  https://api.slack.com/messaging/webhooks
- pagerduty: Events API v2 `trigger`/`resolve` with a stable `dedup_key`:
  https://developer.pagerduty.com/docs/events-api-v2/trigger-events/
- alertmanager: `POST /api/v2/alerts` with a list of postable alerts;
  `endsAt` in the past resolves (Alertmanager's OpenAPI spec).

A firing alert carries the past incidents most like it (logstream.memory): the top one's
time, verdicts, comments and resolution as short annotations (`past_incident`,
`past_verdict`, `past_resolution`, `past_incident_url`), all of them as JSON in the
webhook's alert (`pastIncidents`) and PagerDuty's `custom_details.past_incidents`, and a
"Seen before" section in Slack.

Every request carries an `Idempotency-Key` header; receivers that honour it
can drop the duplicates that at-least-once delivery implies.

Slack parses `&`, `<` and `>` in mrkdwn (and in the fallback `text`) as
control sequences: `<!channel>` pings everyone, `<https://x|label>` is a
disguised link. Log-derived text is attacker-controlled, so every such field
is escaped as Slack documents (https://api.slack.com/reference/surfaces/formatting#escaping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logstream.alerts import past
from logstream.alerts.alert import Alert, rfc3339
from logstream.alerts.config import (
    AlertmanagerConfig,
    AlertsConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
)
from logstream.alerts.links import RUNBOOK

ALERTNAME = "LogAnomaly"
SLACK_HEADER_CHARS = 150  # Block Kit limit for a header's plain_text
SLACK_SECTION_CHARS = 3000  # Block Kit limit for a section's text
SLACK_BUTTONS = 5  # buttons shown (Block Kit allows 25 per actions block)
SLACK_BUTTON_TEXT = 75  # Block Kit limit for a button's text
SLACK_URL_CHARS = 3000  # Block Kit limit for a button's url
SLACK_PAST_CHARS = 300  # a past incident's headline and verdicts each; its resolution twice that
PAGERDUTY_SUMMARY_CHARS = 1024  # Events v2 limit
PAGERDUTY_SEVERITY = {"critical": "critical", "error": "error", "warning": "warning"}


@dataclass(frozen=True, slots=True)
class Request:
    """What to send; `url` and `headers` may hold secrets: never log them."""

    url: str
    body: Any
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Channel:
    """A configured destination: `name` is `receiver/kind/index` (safe to log)."""

    name: str
    receiver: str
    kind: str
    config: WebhookConfig | SlackConfig | PagerDutyConfig | AlertmanagerConfig

    def render(self, alert: Alert, idempotency_key: str) -> Request:
        request = RENDERERS[self.kind](self.config, alert)
        return Request(request.url, request.body, {**request.headers, "Idempotency-Key": idempotency_key})


def channels(config: AlertsConfig) -> dict[str, Channel]:
    """Every channel of every receiver, by name."""
    out: dict[str, Channel] = {}
    for receiver in config.receivers:
        for kind in RENDERERS:
            for i, cfg in enumerate(getattr(receiver, f"{kind}_configs")):
                name = f"{receiver.name}/{kind}/{i}"
                out[name] = Channel(name, receiver.name, kind, cfg)
    return out


def _annotations(alert: Alert) -> dict[str, str]:
    """Everything a responder reads first; empty ones are left out (annotations are text)."""
    runbook = next((url for name, url in alert.links if name == RUNBOOK), "")
    notes = {
        "summary": alert.summary,
        "count": str(alert.count),
        "distinct": str(alert.distinct),
        "first_line": alert.first_line,
        "last_line": alert.last_line,
        "lines": "\n".join(alert.examples) if len(alert.examples) > 1 else "",
        "template": alert.template_text,
        "source": alert.location,
        "context_before": "\n".join(alert.context_before),
        "context_after": "\n".join(alert.context_after),
        "event_time": rfc3339(alert.starts_at) if alert.starts_at else "",
        "explanation": alert.explanation,
        "model_id": alert.model_id,
        "model_version": alert.model_version,
        "max_score": f"{alert.max_score:.3f}",
        "threshold": f"{alert.threshold:.3f}",
        "runbook_url": runbook,
        # annotation names must be label names (Alertmanager refuses others): one text field
        "links": "\n".join(f"{name}: {url}" for name, url in alert.links if name != RUNBOOK),
        **_past_annotations(alert),
    }
    return {k: v for k, v in notes.items() if v}


def _past_annotations(alert: Alert) -> dict[str, str]:
    """The most alike past incident, short: when and which, what was said, what was done."""
    if not alert.past_incidents:
        return {}
    top = alert.past_incidents[0]
    return {
        "past_incident": past.headline(top),
        "past_verdict": past.verdicts(top),
        "past_resolution": past.resolution(top),
        "past_incident_url": str(top.get("url", "")),
    }


# Labels routes and silences see that a sent alert leaves to its annotations: a label is the
# alert's identity in Alertmanager, and these change without the incident changing (a new
# model version, a stream moved to another partition; a file path is long).
ANNOTATION_ONLY = ("model_id", "source")


def _labels(alert: Alert) -> dict[str, str]:
    """alertname, the group's labels and the incident's severity: short values that stay the
    same for the incident (the template is its 12-digit hash, its text is the `template`
    annotation); empty values left out (in Prometheus an empty label is an absent one)."""
    labels = {"alertname": ALERTNAME, **alert.labels, "severity": alert.severity}
    return {k: v for k, v in labels.items() if v and k not in ANNOTATION_ONLY}


def _generator_url(alert: Alert) -> str:
    """The first configured link (e.g. the logs in Grafana Explore), else the runbook."""
    return alert.links[0][1] if alert.links else ""


def _starts_at(alert: Alert) -> str:
    return rfc3339(alert.starts_at or alert.first_seen)


def _ends_at(alert: Alert) -> str:
    return rfc3339(alert.ended_at) if alert.ended_at is not None else "0001-01-01T00:00:00Z"


def render_webhook(cfg: WebhookConfig, alert: Alert) -> Request:
    body = {
        "version": "4",
        "groupKey": alert.dedup_key,
        "truncatedAlerts": 0,
        "status": alert.status,
        "receiver": alert.receiver,
        "groupLabels": alert.group_labels,
        "commonLabels": _labels(alert),
        "commonAnnotations": _annotations(alert),
        "externalURL": cfg.external_url,
        "alerts": [
            {
                "status": alert.status,
                "labels": _labels(alert),
                "annotations": _annotations(alert),
                "startsAt": _starts_at(alert),
                "endsAt": _ends_at(alert),
                "generatorURL": _generator_url(alert),
                "fingerprint": alert.dedup_key,
                "pastIncidents": list(alert.past_incidents),
            }
        ],
    }
    headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}
    return Request(cfg.url.get_secret_value(), body, headers)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slack_escape(text: str) -> str:
    """Slack's escaping for mrkdwn and `text`: `&` first, then `<` and `>`."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut_escaped(text: str, limit: int) -> str:
    """Escape, then cut to `limit` characters without splitting an entity like `&lt;`."""
    escaped = slack_escape(text)
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    amp = cut.rfind("&", max(0, len(cut) - 4))
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


def render_slack(cfg: SlackConfig, alert: Alert) -> Request:
    icon = ":white_check_mark:" if alert.status == "resolved" else ":rotating_light:"
    title = f"{alert.severity.upper()} log anomaly on {alert.stream}"
    if alert.status == "resolved":
        title = f"RESOLVED: {title}"
    lines = _slack_lines(alert).replace("```", "'''")
    # the code block's fences take 6 of the section's characters
    code = "```" + _cut_escaped(lines, SLACK_SECTION_CHARS - 6) + "```"
    # plain_text is shown as is (no links, no mentions): not escaped, or "&lt;" would show
    header = {"type": "plain_text", "text": _cut(title, SLACK_HEADER_CHARS)}
    score = f"{alert.max_score:.2f} (threshold {alert.threshold:.2f})"
    model = " ".join(x for x in (alert.model_id, alert.model_version) if x)
    fields = [
        f"*Count*\n{alert.count}",
        f"*Max score*\n{score}",
        f"*Since*\n{_starts_at(alert)}",
        f"*Model*\n{slack_escape(model) or 'n/a'}",
        f"*Source*\n{slack_escape(alert.location) or 'n/a'}",
        f"*Template*\n{_cut_escaped(alert.template_text, 1000) or 'n/a'}",
    ]
    context = _cut_escaped(f"Why: {alert.explanation or 'n/a'}", SLACK_SECTION_CHARS)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": header},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "section", "text": {"type": "mrkdwn", "text": code}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]
    if alert.past_incidents:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _slack_past(alert)}})
    buttons = [
        {"type": "button", "text": {"type": "plain_text", "text": _cut(name, SLACK_BUTTON_TEXT)}, "url": url}
        for name, url in alert.links[:SLACK_BUTTONS]
        if len(url) <= SLACK_URL_CHARS
    ]
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    body = {"text": f"{icon} {slack_escape(alert.summary)}", "blocks": blocks}
    return Request(cfg.api_url.get_secret_value(), body, {})


def _slack_past(alert: Alert) -> str:
    """*Seen before*, one bullet per past incident: when, which, what was said and done (log
    and operator text escaped, each part cut to its share; a configured link is the
    fingerprint's link). Bullets that would pass the section's limit are left out."""
    text = "*Seen before*"
    for found in alert.past_incidents:
        head = _cut_escaped(past.headline(found), SLACK_PAST_CHARS)
        url = str(found.get("url", ""))
        fingerprint = slack_escape(str(found.get("fingerprint", "")))
        if url and fingerprint and len(url) <= SLACK_URL_CHARS and not any(c in url for c in "<>|"):
            head = head.replace(fingerprint, f"<{url}|{fingerprint}>", 1)
        bullet = f"\n• {head}"
        if said := past.verdicts(found):
            bullet += f"\n   *Verdict:* {_cut_escaped(said, SLACK_PAST_CHARS)}"
        if done := past.resolution(found):
            bullet += f"\n   *Resolution:* {_cut_escaped(done, 2 * SLACK_PAST_CHARS)}"
        if len(text) + len(bullet) > SLACK_SECTION_CHARS:
            break
        text += bullet
    return text


def _slack_lines(alert: Alert) -> str:
    """The anomalous lines between their context lines, as `grep -B -A` shows them."""
    before = [f"  {line}" for line in alert.context_before]
    after = [f"  {line}" for line in alert.context_after]
    lines = [f"> {line}" for line in (alert.examples or [alert.first_line])]
    if alert.count > len(lines):
        lines.append(f"> ... {alert.count} lines in all, last: {alert.last_line}")
    return "\n".join([*before, *lines, *after])


def render_pagerduty(cfg: PagerDutyConfig, alert: Alert) -> Request:
    key = cfg.routing_key.get_secret_value()
    if alert.status == "resolved":
        body: dict[str, Any] = {
            "routing_key": key,
            "event_action": "resolve",
            "dedup_key": alert.dedup_key,
        }
        return Request(cfg.url, body, {})
    body = {
        "routing_key": key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key,
        "payload": {
            "summary": _cut(alert.summary, PAGERDUTY_SUMMARY_CHARS),
            "source": alert.stream or "logstream",
            "severity": PAGERDUTY_SEVERITY.get(alert.severity, "warning"),
            "timestamp": _starts_at(alert),
            "component": alert.stream,
            "group": alert.receiver,
            "class": "log_anomaly",
            "custom_details": _annotations(alert) | _past_details(alert),
        },
        "client": "logstream",
        "links": [{"href": url, "text": name} for name, url in alert.links]
        + [{"href": p["url"], "text": f"Past incident {p['fingerprint']}"} for p in alert.past_incidents if p.get("url")],
    }  # fmt: skip
    return Request(cfg.url, body, {})


def _past_details(alert: Alert) -> dict[str, Any]:
    """PagerDuty's custom_details take JSON: every past incident, whole."""
    return {"past_incidents": list(alert.past_incidents)} if alert.past_incidents else {}


def render_alertmanager(cfg: AlertmanagerConfig, alert: Alert) -> Request:
    posted: dict[str, Any] = {
        "labels": _labels(alert),
        "annotations": _annotations(alert),
        "startsAt": _starts_at(alert),
        "generatorURL": _generator_url(alert),
    }
    if alert.ended_at is not None:
        posted["endsAt"] = rfc3339(alert.ended_at)
    headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}
    return Request(cfg.url.rstrip("/") + "/api/v2/alerts", [posted], headers)


RENDERERS: dict[str, Callable[[Any, Alert], Request]] = {
    "webhook": render_webhook,
    "slack": render_slack,
    "pagerduty": render_pagerduty,
    "alertmanager": render_alertmanager,
}
