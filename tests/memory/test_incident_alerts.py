"""The incident memory in the alert pipeline: serve's sink records every group in the memory
beside its outbox, and each firing alert, as real HTTP receivers on 127.0.0.1 get it,
carries the past incidents most like it with their time, verdicts and resolution; a
resolution written between two pages (through the real CLI, or serve's authenticated HTTP
port) reaches the second page; serve's wiring keeps the memory within its cap and
retention; new incidents get the detector model's embedding of their lines."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from alerts_support import FakeClock, anomaly, write_routes
from http_receivers import Receiver
from http_support import exchange, status
from kafka_broker import free_port

from logstream.alerts.alert import rfc3339
from logstream.alerts.config import load_config
from logstream.alerts.pipeline import AlertSink, drain, run_replay_alerts
from logstream.detector import Detector
from logstream.http_api import open_feedback, serve_feedback
from logstream.memory.embedding import LineEmbedder, embedding_space
from logstream.memory.settings import IncidentMemorySettings
from logstream.metrics import BoundedWSGIServer
from logstream.records import Anomaly
from logstream.serve import open_sink
from logstream.settings import ServeSettings, load_settings

ALICE = "alice-token-0123456789abcdef"
FIRST = "ERROR disk /var/lib/api/seg-00017.log failed with ENOSPC"
SECOND = "ERROR disk /var/lib/web/seg-00301.log failed with ENOSPC"
FIX = "the backup job filled /var; moved its staging dir to /backup"
SAID = "real: disk filled by the backup job"
LINK = "https://wiki.example/incidents/{{fingerprint}}"


@dataclass
class Served:
    """Serve's alert sink and feedback port, opened as `logstream serve` opens them."""

    settings: ServeSettings
    routes: Path
    sink: AlertSink
    port: int
    server: BoundedWSGIServer


@contextmanager
def serving(tmp_path: Path, receiver_doc: dict[str, Any], incidents: dict[str, Any]) -> Iterator[Served]:
    """A serve config with sink kind alerts, a tokens file and `incidents`; its sink
    (`serve.open_sink`) and its feedback port, whose /incidents routes use the sink's memory
    (serve's own wiring)."""
    routes = write_routes(tmp_path, [receiver_doc])
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\n")
    port = free_port()
    config = tmp_path / "serve.yaml"
    doc = {
        "model": {"dir": str(tmp_path / "model")},
        "kafka": {"topics": ["logs"]},
        "sink": {"kind": "alerts", "routes": str(routes)},
        "feedback": {"host": "127.0.0.1", "port": port, "tokens_file": str(tokens)},
        "incidents": incidents,
    }
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    settings = load_settings(config)
    sink = open_sink(settings)
    assert isinstance(sink, AlertSink)
    endpoint = open_feedback(settings)
    assert endpoint is not None
    endpoint.incidents = sink.memory  # as serve() does once the sink is open
    server = serve_feedback(settings, endpoint)
    assert server is not None
    try:
        yield Served(settings, routes, sink, port, server)
    finally:
        server.shutdown()
        server.server_close()
        sink.close(grace=0)
        endpoint.store.close()


def hook(url: str) -> dict[str, Any]:
    return {"name": "hook", "webhook_configs": [{"url": url + "/hook"}]}


def firing(receiver: Receiver, stream: str) -> dict[str, Any]:
    """The first firing alert the webhook received about `stream` (waiting up to 30 s)."""

    def found() -> list[dict[str, Any]]:
        return [
            alert
            for request in receiver.ok()
            for alert in request.body["alerts"]
            if alert["status"] == "firing" and alert["labels"]["stream"] == stream
        ]

    assert receiver.wait_for(lambda _: bool(found()), timeout=30), [r.body for r in receiver.requests]
    return found()[0]


def resolve_over_http(port: int, fingerprint: str, text: str) -> bytes:
    content = json.dumps({"text": text}).encode()
    head = (
        f"POST /incidents/{fingerprint}/resolution HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n"
    )
    return exchange(port, head.encode() + content)


@pytest.mark.parametrize("written_by", ["cli", "http"])
def test_a_resolution_written_between_two_pages_reaches_the_second_alert(
    tmp_path: Path, written_by: str
) -> None:
    """The same kind of incident paged twice (two streams); between them alice writes what
    was done about the first (`logstream incidents resolve` in a process of its own, or POST
    /incidents/FP/resolution with her token). The second alert, as the webhook gets it,
    carries the first incident with that resolution and her name, in its annotations and in
    its JSON."""
    with Receiver() as receiver, serving(tmp_path, hook(receiver.url), {}) as served:
        served.sink.put([anomaly(stream="prod-api", line=FIRST)])
        fingerprint = firing(receiver, "prod-api")["fingerprint"]
        if written_by == "cli":
            done = subprocess.run(
                [sys.executable, "-m", "logstream.cli", "incidents", "resolve", fingerprint, "-m", FIX,
                 "--by", "alice", "--alerts", str(served.routes)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        else:
            answer = resolve_over_http(served.port, fingerprint, FIX)
            assert status(answer) == 200, answer
        served.sink.put([anomaly(stream="prod-web", line=SECOND)])
        second = firing(receiver, "prod-web")
    assert second["annotations"]["past_resolution"] == f"{FIX} (alice)"
    (past,) = second["pastIncidents"]
    assert (past["fingerprint"], past["resolution"], past["resolved_by"]) == (fingerprint, FIX, "alice")


def test_serves_memory_stays_within_its_cap_and_retention(tmp_path: Path) -> None:
    """Through serve's sink with `incidents: {max_incidents: 3, retention: 1s}`: ten incidents
    (ten streams) leave three in the file and the index; once a second has passed, the
    outbox's prune (what the delivery worker runs) deletes them all."""
    incidents = {"max_incidents": 3, "retention": "1s"}
    with Receiver() as receiver, serving(tmp_path, hook(receiver.url), incidents) as served:
        for n in range(10):
            served.sink.put([anomaly(stream=f"prod-{n}", line=f"{FIRST} #{n}")])
        memory = served.sink.memory
        assert memory is not None
        assert memory.store.count() == 3 and len(memory.index) == 3
        last_seen = max(i.last_seen for i in memory.store.all())
        for _ in range(300):  # bounded: until the retention has passed on the wall clock
            if time.time() > last_seen + 1.0:
                break
            time.sleep(0.01)
        served.sink.outbox.prune(time.time())
        assert memory.store.count() == 0 and len(memory.index) == 0
        with closing(sqlite3.connect(served.sink.outbox.path)) as db:
            assert db.execute("SELECT COUNT(*) FROM incidents").fetchone() == (0,)


# -- what each channel carries ----------------------------------------------------------------


@dataclass
class Carried:
    """The requests each channel received about the second incident, and the first's facts."""

    bodies: dict[str, Any]  # channel path -> the body about prod-web's firing alert
    fingerprint: str
    starts_at: float


def _fires_on_web(path: str, sent: Any) -> bool:
    """Whether a channel's request is the firing notification about prod-web."""
    if path == "/pd":
        return sent["event_action"] == "trigger" and sent["payload"]["source"] == "prod-web"
    if path == "/hook":
        return sent["status"] == "firing" and sent["alerts"][0]["labels"]["stream"] == "prod-web"
    if path == "/am/api/v2/alerts":
        return "endsAt" not in sent[0] and sent[0]["labels"]["stream"] == "prod-web"
    return "prod-web" in sent["text"]  # Slack: firing notifications only (send_resolved false)


@pytest.fixture(scope="module")
def carried(tmp_path_factory: pytest.TempPathFactory) -> Carried:
    """One receiver with a webhook, Slack, PagerDuty and Alertmanager channel, all on one real
    HTTP server; the memory links past incidents to a wiki. The first incident gets bob's
    verdict and alice's resolution, then the same kind pages again a day later."""
    tmp = tmp_path_factory.mktemp("carried")
    clock = FakeClock()
    with Receiver() as receiver:
        doc = {
            "name": "oncall",
            "webhook_configs": [{"url": receiver.url + "/hook"}],
            "slack_configs": [{"api_url": receiver.url + "/slack"}],
            "pagerduty_configs": [{"routing_key": "R0UT1NGKEY", "url": receiver.url + "/pd"}],
            "alertmanager_configs": [{"url": receiver.url + "/am"}],
        }
        config = load_config(write_routes(tmp, [doc]))
        sink = AlertSink(config, deliver=False, clock=clock, incidents=IncidentMemorySettings(link=LINK))
        memory = sink.memory
        assert memory is not None
        sink.put([anomaly(stream="prod-api", line=FIRST)])
        assert drain(sink.outbox, timeout=10, clock=clock) == 0
        (first,) = memory.store.all()
        memory.attach_verdict(first.fingerprint, "anomaly", SAID, by="bob")
        memory.resolve(first.fingerprint, FIX, by="alice")
        clock.advance(86400)
        sink.put([anomaly(stream="prod-web", line=SECOND)])
        assert drain(sink.outbox, timeout=10, clock=clock) == 0
        sink.close(grace=0)
        bodies = {r.path: r.body for r in receiver.ok() if _fires_on_web(r.path, r.body)}
    return Carried(bodies, first.fingerprint, first.starts_at)


def test_slack_shows_the_past_incident_with_its_verdict_resolution_and_link(carried: Carried) -> None:
    """Slack's message ends with a "Seen before" section: the first incident's time, its link
    (the wiki, on its fingerprint), bob's verdict and comment, alice's resolution."""
    section = carried.bodies["/slack"]["blocks"][-1]["text"]["text"]
    url = LINK.replace("{{fingerprint}}", carried.fingerprint)
    assert section.startswith("*Seen before*\n• " + rfc3339(carried.starts_at))
    assert f"<{url}|{carried.fingerprint}>" in section
    assert f'*Verdict:* anomaly "{SAID}" (bob)' in section
    assert f"*Resolution:* {FIX} (alice)" in section


def test_pagerduty_carries_every_past_incident_and_links_it(carried: Carried) -> None:
    """PagerDuty's custom_details hold the past incidents whole (time, verdicts, resolution)
    and the top one short; its link is among the event's links."""
    payload = carried.bodies["/pd"]
    details = payload["payload"]["custom_details"]
    (past,) = details["past_incidents"]
    assert past["starts_at"] == carried.starts_at and past["resolution"] == FIX
    assert [(v["verdict"], v["comment"], v["by"]) for v in past["verdicts"]] == [("anomaly", SAID, "bob")]
    assert details["past_resolution"] == f"{FIX} (alice)"
    url = LINK.replace("{{fingerprint}}", carried.fingerprint)
    assert {"href": url, "text": f"Past incident {carried.fingerprint}"} in payload["links"]


def test_alertmanager_annotations_carry_the_top_past_incident_short(carried: Carried) -> None:
    """Alertmanager's annotations (text, label-named) say when and which the top past incident
    was, what was said about it, what was done, and its link."""
    (posted,) = carried.bodies["/am/api/v2/alerts"]
    annotations = posted["annotations"]
    assert annotations["past_incident"].startswith(f"{rfc3339(carried.starts_at)} {carried.fingerprint} (")
    assert annotations["past_verdict"] == f'anomaly "{SAID}" (bob)'
    assert annotations["past_resolution"] == f"{FIX} (alice)"
    assert annotations["past_incident_url"] == LINK.replace("{{fingerprint}}", carried.fingerprint)


def test_the_webhook_json_carries_every_past_incident(carried: Carried) -> None:
    """The generic webhook's alert has `pastIncidents`: each with its time, verdicts and
    resolution, as `logstream incidents search --json` writes them."""
    (alert,) = carried.bodies["/hook"]["alerts"]
    (past,) = alert["pastIncidents"]
    assert past["fingerprint"] == carried.fingerprint and past["starts_at"] == carried.starts_at
    assert past["verdicts"][0]["comment"] == SAID and past["resolution"] == FIX
    assert past["url"] == LINK.replace("{{fingerprint}}", carried.fingerprint)


def test_a_stored_notification_keeps_the_past_incidents_it_was_made_with(tmp_path: Path) -> None:
    """The past incidents are looked up when the notification is made and stored with its
    deliveries: a resolution written afterwards does not change what a retry sends."""
    clock = FakeClock()
    config = load_config(write_routes(tmp_path, [hook("http://127.0.0.1:9")]))
    sink = AlertSink(config, deliver=False, clock=clock, incidents=IncidentMemorySettings())
    try:
        sink.put([anomaly(stream="prod-api", line=FIRST)])
        sink.outbox.flush(clock.now)
        clock.advance(60)
        sink.put([anomaly(stream="prod-web", line=SECOND)])
        (made,) = sink.outbox.flush(clock.now)
        assert sink.memory is not None
        sink.memory.resolve(made.past_incidents[0]["fingerprint"], "written after the page")
        claimed = [d.alert for d in sink.outbox.claim(clock.now, 10) if d.alert.stream == "prod-web"]
    finally:
        sink.close(grace=0)
    assert [a.past_incidents for a in claimed] == [made.past_incidents]
    assert made.past_incidents[0]["resolution"] == ""


def test_a_failing_memory_leaves_the_alert_without_past_incidents_and_sends_it(tmp_path: Path) -> None:
    """A memory whose database fails (here: closed under the sink) costs the alerts their past
    incidents, never the alerts: the anomaly is kept and the notification made."""
    clock = FakeClock()
    config = load_config(write_routes(tmp_path, [hook("http://127.0.0.1:9")]))
    sink = AlertSink(config, deliver=False, clock=clock, incidents=IncidentMemorySettings())
    assert sink.memory is not None
    sink.memory.store.close()
    try:
        sink.put([anomaly(stream="prod-api", line=FIRST)])
        (made,) = sink.outbox.flush(clock.now)
    finally:
        sink.outbox.close()
    assert made.stream == "prod-api" and made.past_incidents == []


def test_a_replay_s_alerts_carry_its_earlier_incidents_and_leave_the_live_memory_alone(
    tmp_path: Path,
) -> None:
    """`run_replay_alerts` (replay --alerts): the second incident of a kind, an hour later in
    the log, carries the first; the dry run writes no outbox file (its memory is in memory)."""
    routes = write_routes(tmp_path, [hook("http://127.0.0.1:9")])
    anomalies: list[Anomaly] = [
        replace(anomaly(stream="prod-api", line=FIRST), detected_at=1_800_000_000.0),
        replace(anomaly(stream="prod-web", line=SECOND), detected_at=1_800_003_600.0),
    ]
    alerts, _ = run_replay_alerts(anomalies, routes)
    first, second = (a for a in alerts if a.status == "firing")
    assert [p["fingerprint"] for p in second.past_incidents] == [first.dedup_key]
    assert first.past_incidents == []
    assert not Path(load_config(routes).delivery.outbox).exists()


# -- the detector model's embedding -----------------------------------------------------------


def test_new_incidents_get_the_detectors_embedding_of_their_line(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With `embed_with(detector)`, a new incident's vector is the detector model's embedding
    of its line (each line alone, as `incidents search --model` embeds text), computed on the
    sink's embedding thread."""
    line = "2026-11-02T08:01:23.801Z worker-0 ERROR db: connection pool exhausted (active=53, waiting=298)"
    detector = Detector.load(synthetic_model_dir)
    config = load_config(write_routes(tmp_path, [hook("http://127.0.0.1:9")]))
    sink = AlertSink(config, deliver=False, incidents=IncidentMemorySettings())
    memory = sink.memory
    assert memory is not None
    try:
        sink.embed_with(lambda: detector)
        sink.put([anomaly(stream="worker-0", line=line)])
        (kept,) = memory.store.all()
        for _ in range(600):  # bounded: 60 s at most
            kept = memory.store.get(kept.fingerprint) or kept
            if kept.embedded:
                break
            time.sleep(0.1)
    finally:
        sink.close(grace=0)
    expected = LineEmbedder.load(synthetic_model_dir).embed_incident([line])
    assert kept.embedded == 1 and kept.embedding is not None
    assert kept.embedding.space == embedding_space(detector.meta) == expected.space
    np.testing.assert_allclose(kept.embedding.vector, expected.vector, rtol=1e-4, atol=1e-5)
