"""Alertmanager's routing dialect: matchers, inhibit_rules, group_by ['...'], record labels,
the default grouping of one stream's burst, and config errors reported all at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from alerts_support import FakeClock, anomaly, webhook, write_routes
from http_receivers import Receiver

from logstream.alerts.config import AlertConfigError, load_config, parse_config
from logstream.alerts.matchers import Matcher, parse_matcher
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain

LABELS = {"stream": "prod-db-1", "severity": "critical", "team": "storage"}


def _open(routes: Path, clock: FakeClock) -> Outbox:
    config = load_config(routes)
    return Outbox(config.delivery.outbox, config, clock=clock)


def _bodies(receiver: Receiver) -> list[dict[str, Any]]:
    return [r.body for r in receiver.ok()]


@pytest.mark.parametrize(
    ("text", "holds"),
    [
        ('stream="prod-db-1"', True),
        ("stream=prod-db-1", True),
        ('stream="prod-db"', False),
        ('severity!="warning"', True),
        ('severity!="critical"', False),
        ('stream=~"prod-.*"', True),
        ('stream=~"prod"', False),  # anchored: the whole value must match
        ('team!~"db|storage"', False),
        ('team!~"db"', True),
        ('namespace=""', True),  # a label the alert lacks is ""
        ('namespace=~".+"', False),
    ],
)
def test_matcher_operators(text: str, holds: bool) -> None:
    """The four operators, as Alertmanager reads them (regexes anchored, missing label = "")."""
    assert parse_matcher(text)(LABELS) is holds


def test_matcher_quoting_round_trips() -> None:
    """Quoted values may hold quotes, commas and spaces; str() gives back a parseable matcher."""
    matcher = parse_matcher(r'comment = "say \"hi\", twice"')
    assert matcher == Matcher("comment", "=", 'say "hi", twice')
    assert parse_matcher(str(matcher)) == matcher


def test_regex_backslashes_stay_as_written() -> None:
    """`=~"\\d+"` is the regex \\d+ (only \\" and \\\\ are escapes inside quotes)."""
    matcher = parse_matcher(r'partition=~"\d+"')
    assert matcher.value == r"\d+" and matcher({"partition": "12"}) and not matcher({"partition": "x"})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("stream", "not a matcher"),
        ('stream=~"(a"', "bad regex"),
        ('stream="open', "unterminated"),
        ('stream=a"b', "stray quote"),
        ('stream=~"(a)\\1"', "bad regex"),  # a backreference: RE2 refuses to backtrack on log text
        ('stream=~"a+"x', "unterminated"),
    ],
)
def test_bad_matchers_are_refused(text: str, reason: str) -> None:
    """A matcher that cannot be read is a ValueError saying why."""
    with pytest.raises(ValueError, match=reason):
        parse_matcher(text)


def test_route_matchers_pick_receivers(tmp_path: Path) -> None:
    """`matchers` with =~ and != route a critical prod anomaly to the pager, the rest to the team."""
    clock = FakeClock()
    with Receiver() as team, Receiver() as pager:
        routes = write_routes(
            tmp_path, [webhook("team", team.url), webhook("pager", pager.url)],
            route={"routes": [{"matchers": ['stream=~"prod-.*"', 'severity!="warning"'], "receiver": "pager"}]},
        )  # fmt: skip
        outbox = _open(routes, clock)
        outbox.put([
            anomaly(stream="prod-api", severity="critical", template_id=1),
            anomaly(stream="prod-api", severity="warning", template_id=2),
            anomaly(stream="dev-api", severity="critical", template_id=3),
        ])  # fmt: skip
        drain(outbox, timeout=10, clock=clock)
        paged = [(b["commonLabels"]["stream"], b["commonLabels"]["severity"]) for b in _bodies(pager)]
        told = sorted((b["commonLabels"]["stream"], b["commonLabels"]["severity"]) for b in _bodies(team))
    assert paged == [("prod-api", "critical")]
    assert told == [("dev-api", "critical"), ("prod-api", "warning")]


def test_record_labels_route_by_team(tmp_path: Path) -> None:
    """A label taken from the record (declared in record_labels) routes, and reaches the payload."""
    clock = FakeClock()
    with Receiver() as default, Receiver() as storage:
        routes = write_routes(
            tmp_path, [webhook("default", default.url), webhook("storage", storage.url)],
            record_labels=["team", "namespace"],
            route={"routes": [{"matchers": ['team="storage"'], "receiver": "storage"}]},
        )  # fmt: skip
        outbox = _open(routes, clock)
        outbox.put([
            anomaly(stream="db-1", template_id=1, labels=(("namespace", "prod"), ("team", "storage"))),
            anomaly(stream="api-1", template_id=2, labels=(("team", "web"),)),
        ])  # fmt: skip
        drain(outbox, timeout=10, clock=clock)
        (stored,) = _bodies(storage)
        (other,) = _bodies(default)
    assert stored["commonLabels"]["team"] == "storage" and stored["commonLabels"]["namespace"] == "prod"
    assert other["commonLabels"]["team"] == "web" and "namespace" not in other["commonLabels"]


def test_group_by_all_labels(tmp_path: Path) -> None:
    """group_by ['...']: anomalies differing in any label (here `level`) are separate groups."""
    clock = FakeClock()
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], route={"group_by": ["..."]})
        outbox = _open(routes, clock)
        outbox.put([anomaly(kind="line"), anomaly(kind="line"), anomaly(kind="end")])
        drain(outbox, timeout=10, clock=clock)
        bodies = _bodies(receiver)
    assert sorted(b["groupLabels"]["kind"] for b in bodies) == ["end", "line"]
    assert sorted(b["alerts"][0]["annotations"]["count"] for b in bodies) == ["1", "2"]
    assert set(bodies[0]["groupLabels"]) >= {"stream", "template", "severity", "level", "model_id"}


def test_inhibit_rule_mutes_warnings_of_a_stream_with_a_critical(tmp_path: Path) -> None:
    """While a critical alert of a stream is open, that stream's warnings are not notified;
    another stream's warning is."""
    clock = FakeClock()
    rule = {
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["stream"],
    }
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], inhibit_rules=[rule])
        outbox = _open(routes, clock)
        outbox.put([
            anomaly(stream="db-1", severity="critical", template_id=1),
            anomaly(stream="db-1", severity="warning", template_id=2),
            anomaly(stream="db-2", severity="warning", template_id=3),
        ])  # fmt: skip
        drain(outbox, timeout=10, clock=clock)
        sent = sorted((b["commonLabels"]["stream"], b["commonLabels"]["severity"]) for b in _bodies(receiver))
    assert sent == [("db-1", "critical"), ("db-2", "warning")]


def test_inhibited_alert_goes_out_after_its_source_resolves(tmp_path: Path) -> None:
    """Inhibition lasts while the source is open: a target still firing after it is notified."""
    clock = FakeClock()
    rule = {
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["stream"],
    }
    with Receiver() as receiver:
        routes = write_routes(
            tmp_path, [webhook("team", receiver.url)], inhibit_rules=[rule], **{"global": {"resolve_timeout": "5m"}}
        )  # fmt: skip
        outbox = _open(routes, clock)
        outbox.put([anomaly(stream="db-1", severity="critical", template_id=1)])
        clock.advance(200)
        outbox.put([anomaly(stream="db-1", severity="warning", template_id=2)])
        drain(outbox, timeout=10, clock=clock)
        muted = [b["commonLabels"]["severity"] for b in _bodies(receiver)]
        clock.advance(150)  # the critical group resolves (300 s quiet); the warning keeps firing
        outbox.put([anomaly(stream="db-1", severity="warning", template_id=2)])
        drain(outbox, timeout=10, clock=clock)
        after = sorted((b["status"], b["commonLabels"]["severity"]) for b in _bodies(receiver))
    assert muted == ["critical"]
    assert after == [("firing", "critical"), ("firing", "warning"), ("resolved", "critical")]


def test_default_grouping_makes_one_incident_of_an_oom_fs_error_burst(tmp_path: Path) -> None:
    """OOM kill -> EXT3 error -> read-only remount on one stream within 2 s: ONE notification
    (default group_by: stream) listing all three lines, with one dedup key."""
    clock = FakeClock()
    burst = [
        "kernel: Out of memory: Kill process 4242 (java) score 901 or sacrifice child",
        "kernel: EXT3-fs error (device sda1): ext3_find_entry: reading directory #2 offset 0",
        "kernel: Remounting filesystem read-only",
    ]
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        doc = yaml.safe_load(routes.read_text())
        del doc["route"]["group_by"], doc["route"]["group_wait"]  # the defaults: by stream, 30s
        routes.write_text(yaml.safe_dump(doc))
        outbox = _open(routes, clock)
        for i, line in enumerate(burst):
            outbox.put([anomaly(stream="node-7", template_id=i, line=line)])
            clock.advance(0.9)
        outbox.put([anomaly(stream="node-8", template_id=9)])  # another stream: its own incident
        clock.advance(30)
        drain(outbox, timeout=10, clock=clock)
        bodies = [b for b in _bodies(receiver) if b["commonLabels"]["stream"] == "node-7"]
    (alert,) = bodies
    notes = alert["alerts"][0]["annotations"]
    assert notes["count"] == "3" and notes["distinct"] == "3"
    assert notes["lines"].splitlines() == burst
    assert alert["groupLabels"] == {"stream": "node-7"}


def test_config_errors_are_all_reported(tmp_path: Path) -> None:
    """Several mistakes in one file: every one is named, in one line, none summarised away."""
    doc = yaml.safe_load(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")]).read_text())
    doc["route"].update(receiver="pager", group_wait="soon", group_by=["...", "stream"])
    doc["route"]["routes"] = [
        {"matchers": ['team="db"'], "receiver": "nobody"},
        {"matchers": ['stream=~"(x"']},
    ]
    doc["inhibit_rules"] = [
        {"source_matchers": ['severity="critical"'], "target_matchers": ["x=1"], "equal": ["host"]}
    ]
    doc["links"] = [{"name": "logs", "url": "https://grafana.example/explore?s={{strem}}"}]
    with pytest.raises(AlertConfigError) as caught:
        parse_config(doc, source="alerts.yaml")
    message = str(caught.value)
    assert "\n" not in message and "more)" not in message
    for problem in (
        "route.receiver: unknown receiver 'pager'",
        "route.group_wait: not a duration",
        "route.group_by: '...' (every label) must be the only group_by entry",
        "route.routes[0].matchers: unknown label 'team'",
        "route.routes[0].receiver: unknown receiver 'nobody'",
        "route.routes[1].matchers: matcher 'stream=~\"(x\"': bad regex",
        "inhibit_rules[0].target_matchers: unknown label 'x'",
        "inhibit_rules[0].equal: unknown label 'host'",
        "links[0].url: unknown variable {{strem}}",
    ):
        assert problem in message, (problem, message)


def test_record_labels_cannot_shadow_built_in_labels(tmp_path: Path) -> None:
    """record_labels naming a built-in label (stream) or an invalid name is refused at load."""
    doc = yaml.safe_load(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")]).read_text())
    doc["record_labels"] = ["stream"]
    with pytest.raises(AlertConfigError, match="'stream' is a built-in alert label"):
        parse_config(doc)
    doc["record_labels"] = ["kube-namespace"]
    with pytest.raises(AlertConfigError, match="not a label name"):
        parse_config(doc)


def test_check_without_secrets_reads_no_file_and_no_env(tmp_path: Path) -> None:
    """secrets=False: env and file references pass unresolved (the file need not exist), and a
    malformed reference (file://) is still an error."""
    receivers = [
        {"name": "team", "slack_configs": [{"api_url": "https://hooks.slack.com/services/${SLACK_PATH}"}],
         "pagerduty_configs": [{"routing_key": "file:/run/secrets/nope"}],
         "webhook_configs": [{"url": "${HOOK_URL}"}]},
    ]  # fmt: skip
    doc = yaml.safe_load(write_routes(tmp_path, receivers).read_text())
    parse_config(doc, secrets=False)
    with pytest.raises(AlertConfigError, match="SLACK_PATH is not set"):
        parse_config(doc)
    doc["receivers"][0]["pagerduty_configs"][0]["routing_key"] = "file:///etc/passwd"
    with pytest.raises(AlertConfigError, match="file:/absolute/path"):
        parse_config(doc, secrets=False)
