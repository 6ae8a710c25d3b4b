"""Grouping, repeats, resolves, silences and routing, end to end to a real receiver.

Group timers run on a FakeClock, so minutes of alerting pass without sleeping.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from alerts_support import FakeClock, alerts_cli, anomaly, template_label, webhook, write_routes
from http_receivers import Receiver

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain


def _open(routes: Path, clock: FakeClock) -> Outbox:
    config = load_config(routes)
    return Outbox(config.delivery.outbox, config, clock=clock)


def _bodies(receiver: Receiver) -> list[dict[str, Any]]:
    return [r.body for r in receiver.ok()]


def test_burst_of_one_incident_is_one_alert(tmp_path: Path) -> None:
    """1,000 anomalies of one stream+template within group_wait -> one notification, count 1000."""
    clock = FakeClock()
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], route={"group_wait": "30s"})
        outbox = _open(routes, clock)
        for i in range(1000):
            outbox.put([anomaly(line=f"ERROR disk failed {i}")])
            clock.advance(0.02)
        clock.advance(30)
        assert drain(outbox, timeout=10, clock=clock) == 0
        (body,) = _bodies(receiver)
    (alert,) = body["alerts"]
    assert alert["annotations"]["count"] == "1000"
    assert alert["annotations"]["first_line"] == "ERROR disk failed 0"
    assert alert["annotations"]["last_line"] == "ERROR disk failed 999"
    assert alert["annotations"]["model_id"] == "tiny-test-model"
    assert alert["annotations"]["explanation"].startswith("the model's chance of 'failed' here")


def test_ongoing_incident_repeats_only_after_repeat_interval(tmp_path: Path) -> None:
    """Anomalies every minute for 2h with repeat_interval 1h -> notifications at 0, 1h, 2h only."""
    clock = FakeClock()
    with Receiver() as receiver:
        outbox = _open(write_routes(tmp_path, [webhook("team", receiver.url)]), clock)
        for _ in range(121):
            outbox.put([anomaly()])
            assert drain(outbox, timeout=10, clock=clock) == 0
            clock.advance(60)
        bodies = _bodies(receiver)
    counts = [b["alerts"][0]["annotations"]["count"] for b in bodies]
    assert counts == ["1", "61", "121"]
    assert len({b["groupKey"] for b in bodies}) == 1  # one incident, one dedup key


def test_new_template_in_a_group_notifies_after_group_interval(tmp_path: Path) -> None:
    """group_by [stream]: a second template joins -> an update, but not before group_interval."""
    clock = FakeClock()
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], route={"group_by": ["stream"]})
        outbox = _open(routes, clock)
        outbox.put([anomaly(template_id=1)])
        drain(outbox, timeout=10, clock=clock)
        clock.advance(10)
        outbox.put([anomaly(template_id=2)])
        drain(outbox, timeout=10, clock=clock)
        before = len(receiver.ok())
        clock.advance(50)  # 60 s after the first notification = group_interval
        drain(outbox, timeout=10, clock=clock)
        bodies = _bodies(receiver)
    assert before == 1
    assert [b["alerts"][0]["annotations"]["distinct"] for b in bodies] == ["1", "2"]


def test_quiet_group_resolves_and_the_next_anomaly_is_a_new_incident(tmp_path: Path) -> None:
    """After resolve_timeout without anomalies: a resolved notification; then a new dedup key."""
    clock = FakeClock()
    with Receiver() as receiver:
        outbox = _open(write_routes(tmp_path, [webhook("team", receiver.url)]), clock)
        outbox.put([anomaly()])
        drain(outbox, timeout=10, clock=clock)
        clock.advance(601)  # resolve_timeout is 10m
        drain(outbox, timeout=10, clock=clock)
        outbox.put([anomaly()])
        drain(outbox, timeout=10, clock=clock)
        bodies = _bodies(receiver)
    assert [b["status"] for b in bodies] == ["firing", "resolved", "firing"]
    assert bodies[0]["groupKey"] == bodies[1]["groupKey"] != bodies[2]["groupKey"]
    assert bodies[1]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"


def test_silenced_alerts_are_not_sent(tmp_path: Path) -> None:
    """A silence on stream prod-db mutes its alerts; another stream's alert still goes out."""
    clock = FakeClock()
    silence = {"matchers": {"stream": "prod-db*"}, "expires_at": clock.now + 3600}
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], silences=[silence])
        outbox = _open(routes, clock)
        outbox.put([anomaly(stream="prod-db-1"), anomaly(stream="prod-api")])
        drain(outbox, timeout=10, clock=clock)
        streams = [b["commonLabels"]["stream"] for b in _bodies(receiver)]
    assert streams == ["prod-api"]


def test_alert_goes_out_when_its_silence_expires(tmp_path: Path) -> None:
    """A still-firing group muted by a silence is notified once the silence has expired."""
    clock = FakeClock()
    silence = {"matchers": {"stream": "prod-db*"}, "expires_at": clock.now + 120}
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], silences=[silence])
        outbox = _open(routes, clock)
        outbox.put([anomaly(stream="prod-db-1")])
        drain(outbox, timeout=10, clock=clock)
        muted = len(receiver.ok())
        clock.advance(121)
        outbox.put([anomaly(stream="prod-db-1")])
        drain(outbox, timeout=10, clock=clock)
        bodies = _bodies(receiver)
    assert muted == 0
    assert [b["alerts"][0]["annotations"]["count"] for b in bodies] == ["2"]


def test_silence_added_from_the_cli_mutes_a_running_outbox(tmp_path: Path) -> None:
    """`python -m logstream.alerts silence add` stores a silence; the open outbox obeys it."""
    clock = FakeClock(time.time())  # the CLI's silence starts now, in real time
    silences = tmp_path / "silences.yaml"
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], silences_file=str(silences))
        outbox = _open(routes, clock)
        args = ["silence", "add", "--alerts", str(routes), "--match", "stream=prod-api", "--for", "2h"]
        assert alerts_cli([*args, "--comment", "maintenance"]) == 0
        clock.advance(1)
        outbox.put([anomaly(stream="prod-api"), anomaly(stream="prod-web")])
        drain(outbox, timeout=10, clock=clock)
        streams = [b["commonLabels"]["stream"] for b in _bodies(receiver)]
    assert streams == ["prod-web"]


def test_routes_send_matches_to_their_receivers(tmp_path: Path) -> None:
    """Stream glob + severity route to pager with `continue`, then to team; the rest to default."""
    clock = FakeClock()
    with Receiver() as default, Receiver() as pager, Receiver() as team:
        child = {"group_wait": "0s"}
        routes = write_routes(
            tmp_path,
            [webhook("default", default.url), webhook("pager", pager.url),
             webhook("team", team.url)],
            route={"routes": [
                {"match": {"stream": "prod-*", "severity": "critical"}, "receiver": "pager",
                 "continue": True, **child},
                {"match": {"stream": "prod-*"}, "receiver": "team", "min_score": 5.0},
            ]},
        )  # fmt: skip
        outbox = _open(routes, clock)
        outbox.put([
            anomaly(stream="prod-api", severity="critical", template_id=1),
            anomaly(stream="prod-api", severity="warning", template_id=2, score=6.0),
            anomaly(stream="prod-api", severity="warning", template_id=3, score=4.5),
            anomaly(stream="dev-api", severity="critical", template_id=4),
        ])  # fmt: skip
        drain(outbox, timeout=10, clock=clock)

        def templates(r: Receiver) -> set[str]:
            return {b["commonLabels"]["template"] for b in _bodies(r)}

        label = template_label
        assert templates(pager) == {label(1)}
        assert templates(team) == {label(1), label(2)}
        assert templates(default) == {label(3), label(4)}
