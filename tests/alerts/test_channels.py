"""Each channel's payload, as received by a real HTTP server, has the fields its service
documents (PagerDuty Events v2, Alertmanager API v2, Slack incoming webhooks, webhook v4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from alerts_support import FakeClock, anomaly, template_label, write_routes
from http_receivers import Receiver

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain


def _fire_and_resolve(tmp_path: Path, receiver_doc: dict[str, Any], line: str = "ERROR x") -> None:
    """One incident: firing notification, then quiet past resolve_timeout (10m)."""
    clock = FakeClock()
    config = load_config(write_routes(tmp_path, [receiver_doc]))
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    outbox.put([anomaly(line=line), anomaly(line=line + " again")])
    assert drain(outbox, timeout=10, clock=clock) == 0
    clock.advance(601)
    assert drain(outbox, timeout=10, clock=clock) == 0


def test_pagerduty_trigger_then_resolve_with_one_dedup_key(tmp_path: Path) -> None:
    """Events v2: trigger with routing_key, dedup_key, payload.summary/source/severity; resolve."""
    with Receiver() as pd:
        doc = {
            "name": "pd",
            "pagerduty_configs": [{"routing_key": "R0UT1NGKEY", "url": pd.url + "/v2/enqueue"}],
        }
        _fire_and_resolve(tmp_path, doc)
        trigger, resolve = (r.body for r in pd.ok())
    assert trigger["routing_key"] == "R0UT1NGKEY" and trigger["event_action"] == "trigger"
    payload = trigger["payload"]
    assert payload["source"] == "prod-api" and payload["severity"] == "critical"
    assert (
        payload["summary"].startswith("prod-api: 2 anomalous log lines") and len(payload["summary"]) <= 1024
    )
    assert payload["timestamp"].endswith("Z")
    assert resolve == {
        "routing_key": "R0UT1NGKEY",
        "event_action": "resolve",
        "dedup_key": trigger["dedup_key"],
    }


def test_alertmanager_post_v2_alerts_with_ends_at_on_resolve(tmp_path: Path) -> None:
    """POST /api/v2/alerts takes a list; labels carry alertname; the resolve sets endsAt."""
    with Receiver() as am:
        _fire_and_resolve(tmp_path, {"name": "am", "alertmanager_configs": [{"url": am.url}]})
        requests = am.ok()
    assert {r.path for r in requests} == {"/api/v2/alerts"}
    (firing,), (resolved,) = (r.body for r in requests)
    assert firing["labels"]["alertname"] == "LogAnomaly" and firing["labels"]["stream"] == "prod-api"
    assert "endsAt" not in firing and firing["startsAt"].endswith("Z")
    assert resolved["labels"] == firing["labels"] and resolved["endsAt"] > resolved["startsAt"]


def test_slack_incoming_webhook_text_and_blocks_within_limits(tmp_path: Path) -> None:
    """Slack: fallback `text` plus blocks; a huge line is cut to Block Kit's limits."""
    with Receiver() as slack:
        doc = {"name": "slack", "slack_configs": [{"api_url": slack.url + "/services/T/B/X"}]}
        _fire_and_resolve(tmp_path, doc, line="ERROR " + "y" * 10_000)
        (message,) = (r.body for r in slack.ok())  # send_resolved defaults to false for Slack
    assert message["text"].startswith(":rotating_light: prod-api: 2 anomalous")
    header, fields, code, context = message["blocks"]
    assert header["type"] == "header" and len(header["text"]["text"]) <= 150
    assert len(fields["fields"]) == 6  # count, score, since, model, source, template
    assert code["text"]["type"] == "mrkdwn" and len(code["text"]["text"]) <= 3000
    assert context["type"] == "context"


def test_generic_webhook_is_alertmanager_webhook_v4(tmp_path: Path) -> None:
    """Webhook: version 4 body, firing then resolved, Idempotency-Key header on each request."""
    with Receiver() as hook:
        _fire_and_resolve(tmp_path, {"name": "hook", "webhook_configs": [{"url": hook.url}]})
        requests = hook.ok()
    firing, resolved = (r.body for r in requests)
    assert firing["version"] == "4" and firing["receiver"] == "hook"
    assert (firing["status"], resolved["status"]) == ("firing", "resolved")
    assert firing["groupLabels"] == {"stream": "prod-api", "template": template_label(7)}
    assert firing["alerts"][0]["annotations"]["count"] == "2"
    assert len({r.key for r in requests}) == 2 and all(r.key for r in requests)


def test_slack_text_from_logs_is_escaped(tmp_path: Path) -> None:
    """`<!channel>`, `<!here>` and `<https://evil|Reset>` in a log line, its explanation or the
    model id reach Slack escaped (`&lt;` `&gt;` `&amp;`) in every mrkdwn field and the fallback text."""
    hostile = "ERROR <!channel> <!here> <https://evil.example|Reset your password> & more"
    clock = FakeClock()
    with Receiver() as slack:
        doc = {"name": "slack", "slack_configs": [{"api_url": slack.url + "/services/T/B/X"}]}
        config = load_config(write_routes(tmp_path, [doc]))
        outbox = Outbox(config.delivery.outbox, config, clock=clock)
        bad = replace(anomaly(line=hostile), explanation="'<!here>' here: 1 in 9", model_id="<!channel>")
        outbox.put([bad])
        assert drain(outbox, timeout=10, clock=clock) == 0
        (message,) = (r.body for r in slack.ok())
    header, fields, code, context = message["blocks"]
    mrkdwn = [message["text"], code["text"]["text"], *(f["text"] for f in fields["fields"])]
    mrkdwn += [e["text"] for e in context["elements"]]
    assert all("<" not in text and ">" not in text for text in mrkdwn)
    assert "&lt;!channel&gt; &lt;!here&gt; &lt;https://evil.example|Reset" in code["text"]["text"]
    assert "&amp; more" in code["text"]["text"] and "&lt;!channel&gt;" in message["text"]
    assert "&lt;!here&gt;" in context["elements"][0]["text"]
    assert header["text"]["type"] == "plain_text"  # shown verbatim by Slack: no links, no mentions
