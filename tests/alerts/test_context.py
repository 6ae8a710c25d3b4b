"""What an alert carries besides the line: context lines, source location, log time, model
version, template text, links from URL templates; and where a record's labels and time come from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from alerts_support import FakeClock, anomaly, write_routes
from http_receivers import Receiver

from logstream.alerts.config import AlertConfigError, load_config, parse_config, rfc3339
from logstream.alerts.context import LineContext
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain
from logstream.consumers.parse import RecordParser
from logstream.records import LogRecord, location
from logstream.settings import InputSettings, SettingsError, load_settings

EVENT_TIME = 1_700_000_000.25  # the log's own time: well before the FakeClock's "now"
EXPLORE = (
    "https://grafana.example/explore?stream={{stream}}&from={{from_ms}}&to={{to_ms}}&team={{labels.team}}"
)
RUNBOOK = "https://runbooks.example/{{labels.team}}/{{template}}"


def test_context_before_spans_batches_and_after_comes_from_the_batch() -> None:
    """Two lines before (from earlier batches too) and the next lines of the same stream in the
    batch; other streams' lines never mix in."""
    context = LineContext(before=2, after=2)
    context.attach([("a", "a1"), ("b", "b1"), ("a", "a2")], {})
    flagged = {2: anomaly(stream="a", line="a3")}
    (out,) = context.attach([("a", "a0-x"), ("b", "b2"), ("a", "a3"), ("b", "b3"), ("a", "a4")], flagged)
    assert out.context_before == ("a2", "a0-x")
    assert out.context_after == ("a4",)  # nothing waits for lines not yet here


def test_follow_one_line_at_a_time_equals_attach_over_the_whole_file() -> None:
    """Replay feeds lines one by one (`follow`); an anomaly waits for its stream's next lines however
    far they are, so the context equals one `attach` over the whole file, in the same order."""
    lines = [(f"s{i % 3}" if i % 7 else "s3", f"line {i}") for i in range(60)]
    flagged = {i: anomaly(stream=lines[i][0], line=lines[i][1]) for i in (0, 5, 6, 30, 56, 58, 59)}
    whole = LineContext(before=2, after=2).attach(lines, flagged)
    context = LineContext(before=2, after=2)
    followed = [a for i, (s, line) in enumerate(lines) for a in context.follow(s, line, flagged.get(i))]
    followed += context.finish()
    assert followed == whole
    assert whole[-1].context_after == () and whole[0].context_after == ("line 7", "line 14")


def test_context_memory_is_bounded() -> None:
    """At most max_streams streams are remembered (least recently seen dropped), lines cut."""
    context = LineContext(before=1, after=0, max_streams=2, max_chars=10)
    context.attach([("a", "x" * 100), ("b", "b1"), ("c", "c1")], {})
    flagged = {0: anomaly(stream="a"), 1: anomaly(stream="c")}
    first, second = context.attach([("a", "a2"), ("c", "c2")], flagged)
    assert first.context_before == () and second.context_before == ("c1",)
    context.attach([("d", "y" * 100)], {})
    (cut,) = context.attach([("d", "d2")], {0: anomaly(stream="d")})
    assert cut.context_before == ("y" * 9 + "…",)


def test_location_of_kafka_file_and_stdin_records() -> None:
    """topic/partition@offset for Kafka; path:line (1-based, as an editor counts) for files."""
    assert location(LogRecord("x", source="logs/3", offset=41, source_kind="kafka")) == "logs/3@41"
    assert (
        location(LogRecord("x", source="/var/log/app.log", offset=0, source_kind="file"))
        == "/var/log/app.log:1"
    )
    assert location(LogRecord("x", source="stdin", offset=9, source_kind="stdin")) == "stdin:10"
    assert location(LogRecord("x", source="replay")) == "replay"


def _json_parser(**settings: Any) -> RecordParser:
    return RecordParser(
        InputSettings(format="json", stream_key="json_field", stream_field="host", **settings)
    )


def test_labels_come_from_json_fields_and_regex_groups() -> None:
    """label_fields map JSON fields to labels; label_regex's named groups add more (fields win)."""
    parser = _json_parser(
        label_fields={"team": "kubernetes.labels.team", "namespace": "kubernetes.namespace"},
        label_regex=r"ns=(?P<namespace>[a-z-]+) app=(?P<app>\w+)",
    )
    value = {
        "message": "ERROR ns=ignored app=web failed",
        "host": "node-1",
        "kubernetes": {"namespace": "payments", "labels": {"team": "checkout"}},
    }
    record = parser.parse(json.dumps(value).encode())
    assert isinstance(record, LogRecord)
    assert record.labels == (("app", "web"), ("namespace", "payments"), ("team", "checkout"))


def test_missing_or_odd_label_values_are_left_out() -> None:
    """No such field, an object, or an empty string: no label (never an error, never a reject)."""
    parser = _json_parser(label_fields={"team": "team", "zone": "zone", "owner": "owner"})
    record = parser.parse(b'{"message": "x", "host": "h", "zone": {"a": 1}, "owner": ""}')
    assert isinstance(record, LogRecord) and record.labels == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"2026-11-29T17:00:00.500Z"', 1795971600.5),
        ('"2026-11-29T18:00:00.500+01:00"', 1795971600.5),
        ("1795971600.5", 1795971600.5),
        ("1795971600500", 1795971600.5),  # milliseconds
        ('"yesterday"', 42.0),  # unreadable: the source's own timestamp
        ("true", 42.0),
    ],
)
def test_event_time_from_a_json_field(value: str, expected: float) -> None:
    """timestamp_field: RFC 3339 or unix seconds/milliseconds; otherwise the source's time."""
    parser = _json_parser(timestamp_field="ts")
    record = parser.parse(f'{{"message": "x", "host": "h", "ts": {value}}}'.encode(), timestamp=42.0)
    assert isinstance(record, LogRecord) and record.timestamp == pytest.approx(expected)


def test_record_label_settings_are_checked(tmp_path: Path) -> None:
    """A label regex without named groups, a built-in label name, or label_fields on plain
    lines fail at start, naming the field."""
    cases = {
        "label_regex: 'team=(\\\\w+)'": "label_regex needs named groups",
        "{format: json, label_fields: {stream: host}}": "'stream' is a built-in alert label",
        "{label_fields: {team: team}}": "need format json",
    }
    for body, reason in cases.items():
        config = tmp_path / "serve.yaml"
        section = body if body.startswith("{") else "{" + body + "}"
        config.write_text(f"model: {{dir: m}}\nkafka: {{topics: [t]}}\ninput: {section}\n")
        with pytest.raises(SettingsError, match=reason):
            load_settings(config)


def _routes(tmp_path: Path, receivers: list[dict[str, Any]]) -> Path:
    return write_routes(
        tmp_path, receivers, record_labels=["team"], links=[{"name": "Logs", "url": EXPLORE}],
        route={"runbook_url": RUNBOOK},
    )  # fmt: skip


def _one_incident(routes: Path) -> None:
    clock = FakeClock()
    config = load_config(routes)
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    outbox.put([
        anomaly(
            stream="db 1&x", labels=(("team", "storage/db"),), event_time=EVENT_TIME,
            location="logs/0@41", context_before=("before 1", "before 2"), context_after=("after 1",),
            model_version="2026-11-20T10:00:00Z",
        ),
        anomaly(stream="db 1&x", labels=(("team", "storage/db"),), event_time=EVENT_TIME + 3),
    ])  # fmt: skip
    assert drain(outbox, timeout=10, clock=clock) == 0


def _explore_query(url: str) -> dict[str, list[str]]:
    assert url.startswith("https://grafana.example/explore?")
    return parse_qs(urlsplit(url).query)


def test_webhook_alert_carries_context_links_and_log_time(tmp_path: Path) -> None:
    """Annotations hold template, source, context, model version; startsAt is the log's time;
    generatorURL is the Explore link, with the stream URL-encoded and the time range around it."""
    with Receiver() as receiver:
        _one_incident(
            _routes(tmp_path, [{"name": "team", "webhook_configs": [{"url": receiver.url + "/hook"}]}])
        )
        (body,) = (r.body for r in receiver.ok())
    alert = body["alerts"][0]
    notes = alert["annotations"]
    assert alert["startsAt"] == rfc3339(EVENT_TIME)
    assert notes["template"] == "ERROR disk <PATH> failed with <*> (case 7)"
    assert notes["source"] == "logs/0@41"
    assert notes["context_before"] == "before 1\nbefore 2" and notes["context_after"] == "after 1"
    assert notes["model_id"] == "tiny-test-model" and notes["model_version"] == "2026-11-20T10:00:00Z"
    query = _explore_query(alert["generatorURL"])
    assert query["stream"] == ["db 1&x"] and query["team"] == ["storage/db"]
    assert int(query["from"][0]) == int((EVENT_TIME - 300) * 1000)
    assert int(query["to"][0]) == int((EVENT_TIME + 3 + 300) * 1000)
    assert notes["runbook_url"] == f"https://runbooks.example/storage%2Fdb/{alert['labels']['template']}"


def test_pagerduty_links_and_slack_buttons(tmp_path: Path) -> None:
    """PagerDuty gets `links` [{href, text}]; Slack an actions block with one button per link."""
    with Receiver() as pd, Receiver() as slack:
        receivers = [{
            "name": "team",
            "pagerduty_configs": [{"routing_key": "KEY", "url": pd.url + "/v2/enqueue"}],
            "slack_configs": [{"api_url": slack.url + "/services/T/B/X"}],
        }]  # fmt: skip
        _one_incident(_routes(tmp_path, receivers))
        (trigger,) = (r.body for r in pd.ok() if r.body["event_action"] == "trigger")
        (message,) = (r.body for r in slack.ok())
    assert [link["text"] for link in trigger["links"]] == ["Logs", "Runbook"]
    assert _explore_query(trigger["links"][0]["href"])["stream"] == ["db 1&x"]
    assert trigger["payload"]["timestamp"] == rfc3339(EVENT_TIME)
    (actions,) = (b for b in message["blocks"] if b["type"] == "actions")
    assert [(e["type"], e["text"]["text"]) for e in actions["elements"]] == [
        ("button", "Logs"),
        ("button", "Runbook"),
    ]
    code = next(b for b in message["blocks"] if b["type"] == "section" and "text" in b)["text"]["text"]
    assert code.index("before 2") < code.index("ERROR disk") < code.index("after 1")


def test_link_templates_are_checked_at_load(tmp_path: Path) -> None:
    """Unknown variables, undeclared labels and non-http URLs in link templates fail at load."""
    doc = yaml.safe_load(
        write_routes(
            tmp_path, [{"name": "t", "webhook_configs": [{"url": "http://127.0.0.1:9"}]}]
        ).read_text()
    )
    doc["links"] = [
        {"name": "a", "url": "https://x.example/{{stream}}?t={{labels.team}}"},
        {"name": "b", "url": "javascript:alert({{stream}})"},
    ]
    doc["route"]["runbook_url"] = "https://x.example/{{nope}}"
    with pytest.raises(AlertConfigError) as caught:
        parse_config(doc)
    message = str(caught.value)
    assert "links[0].url: unknown label in {{labels.team}}" in message
    assert "links[1].url: URL scheme 'javascript' is not allowed" in message
    assert "route.runbook_url: unknown variable {{nope}}" in message


def test_notification_latency_is_observed_per_channel_kind(tmp_path: Path) -> None:
    """Each delivered notification adds one sample to logstream_alert_notification_latency_seconds
    for its channel kind (the dashboard's latency panel)."""
    from prometheus_client import REGISTRY

    def count() -> float:
        value = REGISTRY.get_sample_value(
            "logstream_alert_notification_latency_seconds_count", {"channel": "webhook"}
        )
        return value or 0.0

    before = count()
    with Receiver() as receiver:
        _one_incident(
            _routes(tmp_path, [{"name": "team", "webhook_configs": [{"url": receiver.url + "/hook"}]}])
        )
        delivered = len(receiver.ok())
    assert delivered == 1 and count() - before == delivered
