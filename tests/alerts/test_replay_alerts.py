"""Replay with --alerts: what on-call would have received (dry run), or sent (--deliver);
and the serve-side AnomalySink that delivers in the background."""

from __future__ import annotations

import time
from pathlib import Path

from alerts_support import anomaly, template_label, webhook, write_routes
from http_receivers import Receiver

from logstream.alerts.config import load_config
from logstream.alerts.pipeline import format_alert, open_alert_sink, run_replay_alerts
from logstream.alerts.sink import AnomalySink
from logstream.records import Anomaly

T0 = 1_700_000_000.0


def _incident(start: float = T0, minutes: int = 121) -> list[Anomaly]:
    """One anomaly a minute on one stream+template, in event time."""
    return [anomaly(line=f"ERROR disk failed {i}", detected_at=start + 60 * i) for i in range(minutes)]


def test_dry_run_shows_what_on_call_would_receive_and_sends_nothing(tmp_path: Path) -> None:
    """Two hours of one incident: firing at 0, repeats at 1h and 2h (timers due at an anomaly's
    time fire before it), resolve 10m after the last anomaly."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        alerts, pending = run_replay_alerts(_incident(), routes)
        sent = len(receiver.requests)
    assert sent == 0 and pending == 0
    assert [(a.status, a.sequence, a.count) for a in alerts] == [
        ("firing", 1, 1), ("firing", 2, 60), ("firing", 3, 120), ("resolved", 4, 121),
    ]  # fmt: skip
    assert [a.notified_at - T0 for a in alerts] == [0, 3600, 7200, 7200 + 600]
    assert "team/webhook/0" in format_alert(alerts[0], load_config(routes))


def test_replay_with_deliver_sends_every_alert(tmp_path: Path) -> None:
    """--deliver: the same notifications reach the receiver, nothing left pending, even
    those stamped (in event time) after the wall clock."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        incident = _incident(start=time.time())  # its repeats and resolve lie hours ahead
        alerts, pending = run_replay_alerts(incident, routes, deliver=True, timeout=30)
        received = [(r.body["status"], r.body["alerts"][0]["annotations"]["count"]) for r in receiver.ok()]
    assert pending == 0
    assert received == [(a.status, str(a.count)) for a in alerts]


def test_alert_sink_delivers_in_the_background(tmp_path: Path) -> None:
    """open_alert_sink is an AnomalySink: put returns once durable, a worker thread delivers."""
    with Receiver() as receiver:
        sink: AnomalySink = open_alert_sink(write_routes(tmp_path, [webhook("team", receiver.url)]))
        sink.put([anomaly(template_id=1), anomaly(template_id=2)])
        arrived = receiver.wait_for(lambda r: len(r.ok()) == 2, timeout=20)
        sink.close()
    assert arrived
    assert {r.body["commonLabels"]["template"] for r in receiver.ok()} == {
        template_label(1),
        template_label(2),
    }
