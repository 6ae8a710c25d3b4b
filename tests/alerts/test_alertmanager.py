"""logstream -> a real Alertmanager (Debian's prometheus-alertmanager, see .ci/alertmanager.sh):
posted alerts show up in its API with our labels, log time and links, and resolve."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from alertmanager_server import BINARY, AlertmanagerServer
from alerts_support import FakeClock, anomaly, write_routes

from logstream.alerts.config import load_config, rfc3339
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import AlertSink, drain
from logstream.memory.settings import IncidentMemorySettings

WAIT_S = 30.0  # bounded wait for Alertmanager to process what was posted


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertmanagerServer]:
    """A real Alertmanager on a free loopback port, killed at teardown. Without the binary
    (run .ci/alertmanager.sh) these tests skip, except under CI=true, where they fail."""
    if not BINARY.is_file():
        reason = f"Alertmanager missing at {BINARY}: run .ci/alertmanager.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    server = AlertmanagerServer(tmp_path_factory.mktemp("alertmanager"))
    server.start()
    yield server
    server.stop()


def _wait_for(found: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if value := found():
            return value
        time.sleep(0.1)
    raise AssertionError(f"Alertmanager did not show {what} within {WAIT_S:.0f}s")


def _ours(server: AlertmanagerServer, stream: str) -> list[dict[str, Any]]:
    return [a for a in server.alerts() if a["labels"].get("stream") == stream]


def test_alerts_appear_in_alertmanager_with_labels_and_resolve(
    alertmanager: AlertmanagerServer, tmp_path: Path
) -> None:
    """A firing notification is an active Alertmanager alert with alertname, stream, severity,
    the record's team label, startsAt at the log's time and the Explore link as generatorURL;
    the resolve ends it there."""
    # The group timers run on a hand-moved clock that starts in the (real) recent past, so
    # the resolve's endsAt lies in the past by Alertmanager's own clock: resolved at once.
    clock = FakeClock(time.time() - 60)
    event_time = clock.now - 30
    routes = write_routes(
        tmp_path, [{"name": "am", "alertmanager_configs": [{"url": alertmanager.url}]}],
        record_labels=["team"],
        links=[{"name": "Logs", "url": "https://grafana.example/explore?stream={{stream}}"}],
        **{"global": {"resolve_timeout": "5s"}},
    )  # fmt: skip
    config = load_config(routes)
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    try:
        outbox.put([anomaly(stream="db-7", labels=(("team", "storage"),), event_time=event_time)])
        assert drain(outbox, timeout=WAIT_S, clock=clock) == 0
        assert outbox.dead_letters() == []  # Alertmanager took it (a 4xx would dead-letter it)
        (alert,) = _wait_for(lambda: _ours(alertmanager, "db-7"), "the firing alert")
        clock.advance(6)  # quiet past resolve_timeout: the group resolves
        assert drain(outbox, timeout=WAIT_S, clock=clock) == 0
        _wait_for(lambda: not _ours(alertmanager, "db-7"), "the alert resolved")
    finally:
        outbox.close()
    labels = alert["labels"]
    assert labels["alertname"] == "LogAnomaly" and labels["severity"] == "critical"
    assert labels["team"] == "storage" and len(labels["template"]) == 12
    assert alert["startsAt"].startswith(rfc3339(event_time)[:19])
    assert alert["generatorURL"] == "https://grafana.example/explore?stream=db-7"
    assert alert["annotations"]["template"] == "ERROR disk <PATH> failed with <*> (case 7)"
    assert alert["annotations"]["links"] == "Logs: https://grafana.example/explore?stream=db-7"
    assert alert["status"]["state"] == "active"


def test_alertmanager_routing_sees_every_label(alertmanager: AlertmanagerServer, tmp_path: Path) -> None:
    """Two streams, two incidents: both are in Alertmanager, each with its own labels, so its
    own routes and silences can use them."""
    clock = FakeClock(time.time() - 60)
    routes = write_routes(
        tmp_path,
        [{"name": "am", "alertmanager_configs": [{"url": alertmanager.url}]}],
        record_labels=["namespace"],
    )
    config = load_config(routes)
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    try:
        outbox.put([
            anomaly(stream="api-1", severity="warning", labels=(("namespace", "shop"),)),
            anomaly(stream="api-2", severity="critical", labels=(("namespace", "pay"),)),
        ])  # fmt: skip
        assert drain(outbox, timeout=WAIT_S, clock=clock) == 0
        found = _wait_for(
            lambda: len(_ours(alertmanager, "api-1") + _ours(alertmanager, "api-2")) == 2, "both"
        )
    finally:
        outbox.close()
    assert found
    by_stream = {a["labels"]["stream"]: a["labels"] for a in alertmanager.alerts()}
    assert (by_stream["api-1"]["namespace"], by_stream["api-1"]["severity"]) == ("shop", "warning")
    assert (by_stream["api-2"]["namespace"], by_stream["api-2"]["severity"]) == ("pay", "critical")


def test_alertmanager_shows_the_past_incident_an_alert_carries(
    alertmanager: AlertmanagerServer, tmp_path: Path
) -> None:
    """A recurring incident's alert reaches a real Alertmanager with the earlier incident's
    time, resolution and link as annotations (label-named: Alertmanager refuses others)."""
    clock = FakeClock(time.time() - 3600)
    routes = write_routes(tmp_path, [{"name": "am", "alertmanager_configs": [{"url": alertmanager.url}]}])
    settings = IncidentMemorySettings(link="https://wiki.example/incidents/{{fingerprint}}")
    sink = AlertSink(load_config(routes), deliver=False, clock=clock, incidents=settings)
    try:
        sink.put([anomaly(stream="db-8")])
        assert drain(sink.outbox, timeout=WAIT_S, clock=clock) == 0
        assert sink.memory is not None
        (first,) = sink.memory.store.all()
        sink.memory.resolve(first.fingerprint, "rotated the backup volume", by="alice")
        clock.advance(60)
        sink.put([anomaly(stream="db-9")])
        assert drain(sink.outbox, timeout=WAIT_S, clock=clock) == 0
        assert sink.outbox.dead_letters() == []
        (alert,) = _wait_for(lambda: _ours(alertmanager, "db-9"), "the recurring incident's alert")
    finally:
        sink.close(grace=0)
    annotations = alert["annotations"]
    assert annotations["past_incident"].startswith(f"{rfc3339(first.starts_at)} {first.fingerprint} (")
    assert annotations["past_resolution"] == "rotated the backup volume (alice)"
    assert annotations["past_incident_url"] == f"https://wiki.example/incidents/{first.fingerprint}"
