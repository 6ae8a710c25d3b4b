"""Delivery against real receivers on 127.0.0.1 that fail on purpose: retry rules, dead letters."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from email.utils import formatdate
from pathlib import Path

import pytest
import structlog
from alerts_support import anomaly, webhook, write_routes
from http_receivers import Action, Drop, Received, Receiver, Reply, Script, fail_first, free_port

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain

BASE, FACTOR, MAX, JITTER = 0.02, 2.0, 0.2, 0.5  # write_routes' backoff
EPS = 1e-6  # float rounding of unix timestamps


def _outbox(routes: Path) -> Outbox:
    config = load_config(routes)
    return Outbox(config.delivery.outbox, config)


def _deliver(tmp_path: Path, script: Script, n: int = 3, **channel: object) -> tuple[Outbox, Receiver]:
    """Put `n` distinct incidents, deliver until idle; returns the outbox and the receiver."""
    with Receiver(script) as receiver:
        outbox = _outbox(write_routes(tmp_path, [webhook("team", receiver.url, **channel)]))
        outbox.put([anomaly(template_id=i) for i in range(n)])
        assert drain(outbox, timeout=30) == 0
        return outbox, receiver


def _keys(receiver: Receiver) -> set[str]:
    return {r.key for r in receiver.ok()}


def test_5xx_is_retried_until_delivered(tmp_path: Path) -> None:
    """Three 500s per alert, then 200: every alert arrives, nothing is dead-lettered."""
    outbox, receiver = _deliver(tmp_path, fail_first(3, Reply(500)))
    assert len(_keys(receiver)) == 3
    assert all(len(outbox.attempts(k)) == 4 for k in _keys(receiver))
    assert outbox.dead_letters() == []


def test_backoff_delays_follow_the_capped_jittered_schedule(tmp_path: Path) -> None:
    """Each retry waits uniform(d*(1-jitter), d), d = min(max, base*factor**(n-1)); never early."""
    outbox, receiver = _deliver(tmp_path, fail_first(5, Reply(503)), n=2)
    for key in _keys(receiver):
        attempts = outbox.attempts(key)
        assert [a.outcome for a in attempts] == ["retry"] * 5 + ["delivered"]
        for n, (failed, following) in enumerate(itertools.pairwise(attempts), 1):
            ceiling = min(MAX, BASE * FACTOR ** (n - 1))
            assert failed.retry_at is not None
            waited = failed.retry_at - failed.at
            assert ceiling * (1 - JITTER) - EPS <= waited <= ceiling + EPS
            assert following.started_at >= failed.retry_at


def test_429_retry_after_is_honoured(tmp_path: Path) -> None:
    """A 429 with `Retry-After: 1` is retried no sooner than one second later."""
    outbox, receiver = _deliver(tmp_path, fail_first(1, Reply(429, {"Retry-After": "1"})), n=1)
    (key,) = _keys(receiver)
    first, second = outbox.attempts(key)
    assert (first.outcome, first.status_code) == ("retry", 429)
    assert first.retry_at is not None
    assert abs(first.retry_at - first.at - 1.0) <= EPS
    assert second.started_at >= first.retry_at and second.outcome == "delivered"


def test_slow_receiver_past_the_timeout_is_retried(tmp_path: Path) -> None:
    """An answer slower than the channel timeout counts as a failure and is retried."""
    slow = fail_first(1, Reply(200, delay=0.8))
    outbox, receiver = _deliver(tmp_path, slow, n=1, timeout="300ms")
    (key,) = _keys(receiver)
    outcomes = [(a.outcome, a.status_code) for a in outbox.attempts(key)]
    assert outcomes == [("retry", None), ("delivered", 200)]


def test_connection_closed_mid_response_is_retried(tmp_path: Path) -> None:
    """A response cut off mid-body is a transport error: retried, then delivered."""
    outbox, receiver = _deliver(tmp_path, fail_first(2, Drop()), n=2)
    assert len(_keys(receiver)) == 2
    for key in _keys(receiver):
        assert [a.outcome for a in outbox.attempts(key)] == ["retry", "retry", "delivered"]


def test_connection_refused_is_retried_until_the_receiver_comes_up(tmp_path: Path) -> None:
    """Nothing listening: attempts fail and are retried; once a receiver listens, all arrive."""
    port = free_port()
    outbox = _outbox(write_routes(tmp_path, [webhook("team", f"http://127.0.0.1:{port}")]))
    outbox.put([anomaly(template_id=i) for i in range(3)])
    left: list[int] = []
    worker = threading.Thread(target=lambda: left.append(drain(outbox, timeout=30)))
    worker.start()
    db = sqlite3.connect(tmp_path / "outbox.sqlite")
    for _ in range(500):  # until a few refused attempts are on record (bounded)
        if db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] >= 6:
            break
        time.sleep(0.01)
    db.close()
    with Receiver(port=port) as receiver:
        worker.join(35)
    assert left == [0]
    assert len(_keys(receiver)) == 3
    refused = [a for k in _keys(receiver) for a in outbox.attempts(k) if a.outcome == "retry"]
    assert refused and all(a.status_code is None for a in refused)


def test_other_4xx_is_dead_lettered_with_one_log_line(tmp_path: Path) -> None:
    """A 400 is not retried: one request per alert, a dead-letter row and one warning each."""
    with structlog.testing.capture_logs() as logs:
        outbox, receiver = _deliver(tmp_path, lambda _r, _n: Reply(400, body=b"invalid_payload"))
    assert len(receiver.requests) == 3
    dead = outbox.dead_letters()
    assert sorted(d[0] for d in dead) == sorted(r.key for r in receiver.requests)
    assert all(d[2] == 400 for d in dead)
    assert len([e for e in logs if e["event"] == "alert_dead_lettered"]) == 3
    assert outbox.pending() == 0


def test_rate_limit_spaces_deliveries_to_one_channel(tmp_path: Path) -> None:
    """With `rate_limit: 2 per 500ms` no window holds more than 2 + 4/s x its length requests."""
    limit = {"count": 2, "per": "500ms"}
    _, receiver = _deliver(tmp_path, lambda _r, _n: Reply(), n=8, rate_limit=limit)
    times = sorted(r.at for r in receiver.ok())
    assert len(times) == 8
    slack = 0.05  # claim time vs arrival time at the receiver
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 2 + (times[j] - times[i] + slack) * 4


def test_secrets_are_never_logged_or_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token in the webhook URL (from ${ENV}) appears in no log event and not in the outbox."""
    token = "s3cr3t-T0KEN-9f8e7d"
    monkeypatch.setenv("HOOK_TOKEN", token)
    with Receiver(fail_first(1, Reply(500))) as receiver, structlog.testing.capture_logs() as logs:
        routes = write_routes(tmp_path, [webhook("team", receiver.url + "/${HOOK_TOKEN}")])
        outbox = _outbox(routes)
        outbox.put([anomaly(template_id=1)])
        outbox.put([anomaly(template_id=2, line="x" * 10)])
        assert drain(outbox, timeout=30) == 0
        # the secret did reach the receiver (so it was really used) ...
        assert all(r.path == f"/{token}/hook" for r in receiver.requests)
    outbox.close()
    # ... but not the logs or the database files
    assert token not in repr(logs)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("outbox.sqlite*"))
    assert stored and token.encode() not in stored


def test_429_retry_after_as_http_date_is_honoured(tmp_path: Path) -> None:
    """`Retry-After` given as an HTTP date: the retry is scheduled at that moment, not before."""
    dates: list[float] = []

    def busy_for_two_seconds(_request: Received, nth: int) -> Action:
        if nth > 1:
            return Reply()
        dates.append(float(int(time.time() + 2)))  # HTTP dates have whole seconds
        return Reply(429, {"Retry-After": formatdate(dates[0], usegmt=True)})

    outbox, receiver = _deliver(tmp_path, busy_for_two_seconds, n=1)
    (key,) = _keys(receiver)
    first, second = outbox.attempts(key)
    assert first.status_code == 429 and first.retry_at is not None
    assert abs(first.retry_at - dates[0]) <= EPS
    assert second.started_at >= first.retry_at


def test_retries_give_up_after_the_limit_into_dead_letters(tmp_path: Path) -> None:
    """A receiver that never recovers: after `give_up_after` the delivery is dead-lettered."""
    with Receiver(lambda _r, _n: Reply(500)) as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery={"give_up_after": "300ms"})
        outbox = _outbox(routes)
        outbox.put([anomaly()])
        assert drain(outbox, timeout=30) == 0
        attempts = len(receiver.requests)
    ((_key, _channel, status, reason),) = outbox.dead_letters()
    assert status == 500 and reason.startswith(f"gave up after {attempts} attempts")
    assert attempts > 1
