"""The delivery worker never dies silently: a bad answer, a bad row or a locked database is
a retry or a restart, and `healthy()` / `logstream_delivery_worker_up` report it."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alerts_support import FakeClock, anomaly, webhook, write_routes
from http_receivers import Receiver, Reply
from prometheus_client import REGISTRY

from logstream.alerts.config import AlertsConfig, load_config
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import AlertSink, drain

CHANNEL = "team/webhook/0"
FAST_RESTARTS = {"lock_timeout": "100ms", "restart_delay": "20ms", "restart_delay_max": "50ms"}


class TickingClock(FakeClock):
    """Moves 1 s each time it is read, so retries fall due and `give_up_after` is reached."""

    def __call__(self) -> float:
        self.advance(1.0)
        return self.now


def _restarts() -> float:
    return REGISTRY.get_sample_value("logstream_delivery_worker_restarts_total") or 0.0


def _worker_up() -> float | None:
    return REGISTRY.get_sample_value("logstream_delivery_worker_up")


@contextmanager
def _write_locked(path: str) -> Iterator[sqlite3.Connection]:
    """Another connection holds the database's write lock (a real SQLite lock) until exit."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    finally:
        db.execute("ROLLBACK")
        db.close()


def _queued(config: AlertsConfig, template_id: int = 1, clock: Callable[[], float] = time.time) -> None:
    """One anomaly put and its notification enqueued, by a process-local outbox that closes."""
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    outbox.put([anomaly(template_id=template_id)])
    outbox.flush()
    outbox.close()


def test_2xx_with_an_undecodable_body_is_delivered_and_the_worker_goes_on(tmp_path: Path) -> None:
    """200 + `Content-Encoding: gzip` + a body that is not gzip: delivered once, and the
    next alert is still delivered (the worker thread did not end)."""
    bogus = Reply(200, {"Content-Encoding": "gzip"}, body=b"this is not gzip")
    with Receiver(lambda _r, _n: bogus) as receiver:
        sink = AlertSink(load_config(write_routes(tmp_path, [webhook("team", receiver.url)])))
        try:
            sink.put([anomaly(template_id=1)])
            assert receiver.wait_for(lambda r: len(r.requests) == 1, timeout=20)
            sink.put([anomaly(template_id=2)])
            assert receiver.wait_for(lambda r: len(r.requests) == 2, timeout=20)
            assert sink.healthy()
        finally:
            sink.close(grace=0)
    first = receiver.requests[0].key
    outbox = Outbox(tmp_path / "outbox.sqlite", load_config(tmp_path / "alerts.yaml"))
    assert [a.outcome for a in outbox.attempts(first)] == ["delivered"]
    assert len({r.key for r in receiver.requests}) == 2


def test_an_attempt_that_raises_is_retried_and_the_others_delivered(tmp_path: Path) -> None:
    """A stored alert that fails to render (a bug's exception, not a transport error) is
    retried on the backoff schedule until give_up_after; another alert is delivered."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery={"give_up_after": "30s"})
        config = load_config(routes)
        clock = TickingClock()
        _queued(config, template_id=1, clock=clock)
        _queued(config, template_id=2, clock=clock)
        db = sqlite3.connect(config.delivery.outbox, isolation_level=None)
        (bad_id, bad_key), _ = db.execute("SELECT id, idem_key FROM deliveries ORDER BY id").fetchall()
        alert = db.execute("SELECT alert FROM deliveries WHERE id = ?", (bad_id,)).fetchone()[0]
        db.execute(
            "UPDATE deliveries SET alert = ? WHERE id = ?",
            (alert.replace('"max_score":9.0', '"max_score":"high"'), bad_id),
        )
        db.close()
        outbox = Outbox(config.delivery.outbox, config, clock=clock)
        assert drain(outbox, timeout=30, clock=outbox.clock) == 0
    attempts = outbox.attempts(bad_key)
    assert len(attempts) > 1 and all(a.outcome == "retry" for a in attempts[:-1])
    ((key, _channel, _status, reason),) = outbox.dead_letters()
    assert key == bad_key and reason.endswith("ValueError")
    assert {r.key for r in receiver.ok()} == outbox.delivered_keys() and len(receiver.ok()) == 1


def test_an_unreadable_row_is_dead_lettered_and_the_others_delivered(tmp_path: Path) -> None:
    """A delivery row whose alert is not JSON is set aside as a dead letter, not re-read
    forever; the other delivery goes out."""
    with Receiver() as receiver:
        config = load_config(write_routes(tmp_path, [webhook("team", receiver.url)]))
        _queued(config, template_id=1)
        _queued(config, template_id=2)
        db = sqlite3.connect(config.delivery.outbox, isolation_level=None)
        (bad_key,) = db.execute("SELECT idem_key FROM deliveries ORDER BY id LIMIT 1").fetchone()
        db.execute("UPDATE deliveries SET alert = '{not json' WHERE idem_key = ?", (bad_key,))
        db.close()
        outbox = Outbox(config.delivery.outbox, config)
        assert drain(outbox, timeout=30) == 0
    ((key, channel, status, reason),) = outbox.dead_letters()
    assert (key, channel, status) == (bad_key, CHANNEL, None)
    assert reason == "unreadable outbox row: JSONDecodeError"
    assert len(receiver.ok()) == 1 and receiver.ok()[0].key != bad_key


def test_a_locked_database_restarts_the_loop_until_it_is_released(tmp_path: Path) -> None:
    """While another connection holds the write lock the worker loop fails and restarts
    (counted); once the lock goes, the queued alert is delivered by the same sink."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery=FAST_RESTARTS)
        config = load_config(routes)
        _queued(config)
        before = _restarts()
        with _write_locked(config.delivery.outbox):
            sink = AlertSink(config)
            try:
                assert receiver.wait_for(lambda _r: _restarts() >= before + 2, timeout=30)
                assert receiver.requests == []
            except BaseException:
                sink.close(grace=0)
                raise
        try:
            assert receiver.wait_for(lambda r: len(r.ok()) == 1, timeout=30)
        finally:
            sink.close(grace=0)


def test_healthy_is_false_after_repeated_failures_and_true_after_recovery(tmp_path: Path) -> None:
    """`unhealthy_after: 2`: past two consecutive loop failures healthy() is False and the
    worker-up gauge is 0; after the lock is released both recover (1 / True)."""
    clock = FakeClock()  # group timers fall due only when the test moves it
    with Receiver() as receiver:
        delivery = {**FAST_RESTARTS, "unhealthy_after": 2}
        routes = write_routes(
            tmp_path, [webhook("team", receiver.url)], route={"group_wait": "10s"}, delivery=delivery
        )
        config = load_config(routes)
        sink = AlertSink(config, clock=clock)
        try:
            sink.put([anomaly(template_id=1)])
            clock.advance(10)
            sink.worker.wake()
            assert receiver.wait_for(lambda r: len(r.ok()) == 1, timeout=30)
            # settled too: else the lock below fails the settle, not the flush, and the
            # first alert is (rightly) sent again with its idempotency key
            assert receiver.wait_for(lambda _r: sink.outbox.pending() == 0, timeout=30)
            assert receiver.wait_for(lambda _r: sink.healthy() and _worker_up() == 1.0, timeout=30)
            sink.put([anomaly(template_id=2)])
            with _write_locked(config.delivery.outbox):
                clock.advance(10)  # the new group falls due: flushing it is a write, which fails
                sink.worker.wake()
                assert receiver.wait_for(lambda _r: not sink.healthy(), timeout=30)
                assert _worker_up() == 0.0
            assert receiver.wait_for(lambda r: len({q.key for q in r.ok()}) == 2, timeout=30)
            assert receiver.wait_for(lambda _r: sink.healthy() and _worker_up() == 1.0, timeout=30)
        finally:
            sink.close(grace=0)
