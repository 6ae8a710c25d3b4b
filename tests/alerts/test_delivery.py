"""Delivery against real receivers on 127.0.0.1 that fail on purpose: retry rules, dead letters."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

import pytest
import structlog
from alerts_support import FakeClock, anomaly, template_label, webhook, write_routes
from http_receivers import Action, Drop, Received, Receiver, Reply, Script, fail_first, free_port

from logstream.alerts.config import RateLimit, load_config
from logstream.alerts.delivery import DeliveryWorker, TokenBucket
from logstream.alerts.outbox import Outbox
from logstream.alerts.pipeline import drain

BASE, FACTOR, MAX, JITTER = 0.02, 2.0, 0.2, 0.5  # write_routes' backoff
MIN_RETRY_DELAY = 0.01  # write_routes' min_retry_delay
EPS = 1e-6  # float rounding of unix timestamps


def _outbox(routes: Path, clock: Callable[[], float] = time.time) -> Outbox:
    config = load_config(routes)
    return Outbox(config.delivery.outbox, config, clock=clock)


def _deliver(tmp_path: Path, script: Script, n: int = 3, **channel: object) -> tuple[Outbox, Receiver]:
    """Put `n` distinct incidents, deliver until idle; returns the outbox and the receiver."""
    with Receiver(script) as receiver:
        outbox = _outbox(write_routes(tmp_path, [webhook("team", receiver.url, **channel)]))
        outbox.put([anomaly(template_id=i) for i in range(n)])
        assert drain(outbox, timeout=30) == 0
        return outbox, receiver


class SteppingClock(FakeClock):
    """Moves 1 ms each time it is read (thread-safe: the receiver moves it too)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 0.001
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


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
    slow = fail_first(1, Reply(200, delay=5.0))  # far past the timeout, even on a loaded machine
    outbox, receiver = _deliver(tmp_path, slow, n=1, timeout="1s")
    (key,) = _keys(receiver)
    outcomes = [(a.outcome, a.status_code) for a in outbox.attempts(key)]
    assert outcomes[0] == ("retry", None) and outcomes[-1] == ("delivered", 200)


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


def test_token_bucket_schedule_never_exceeds_the_rate() -> None:
    """`2 per 500ms`, 8 sends retried when told: grants at 0, 0, .25, .5 ... (a burst of 2,
    then 4/s), so no window of length w holds more than 2 + 4w grants."""
    bucket = TokenBucket(RateLimit(count=2, per=0.5), now=0.0)
    granted: list[float] = []
    now = 0.0
    for _ in range(100):  # bounded: each send needs at most two takes
        if len(granted) == 8:
            break
        wait = bucket.take(now)
        if wait == 0.0:
            granted.append(now)
        now += wait
    assert granted == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5])
    for i, j in itertools.combinations(range(len(granted)), 2):
        assert j - i + 1 <= 2 + (granted[j] - granted[i]) * 4 + EPS


def test_rate_limit_defers_deliveries_over_the_limit(tmp_path: Path) -> None:
    """With `rate_limit: 2 per 500ms` and the clock held still, exactly 2 of 8 alerts go out
    and the rest are deferred to the bucket's next token (+0.25 s); moving the clock by
    that much releases exactly one more."""
    clock = FakeClock()
    limit = {"count": 2, "per": "500ms"}
    with Receiver() as receiver:
        outbox = _outbox(write_routes(tmp_path, [webhook("team", receiver.url, rate_limit=limit)]), clock)
        outbox.put([anomaly(template_id=i) for i in range(8)])
        worker = DeliveryWorker(outbox, clock=clock)
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            assert receiver.wait_for(lambda r: _settled(tmp_path, clock.now, sent=2), timeout=30)
            waits = _pending_due(tmp_path)
            clock.advance(0.25)
            worker.wake()
            assert receiver.wait_for(lambda r: _settled(tmp_path, clock.now, sent=3), timeout=30)
        finally:
            stop.set()
            worker.wake()
            thread.join(30)
    assert waits == [pytest.approx(clock.now)] * 6  # deferred to the next token, not sent
    assert len(receiver.ok()) == 3 and outbox.pending() == 5


def _pending_due(tmp_path: Path) -> list[float]:
    db = sqlite3.connect(tmp_path / "outbox.sqlite")
    try:
        rows = db.execute("SELECT next_attempt_at FROM deliveries WHERE state = 'pending'").fetchall()
    finally:
        db.close()
    return [r[0] for r in rows]


def _settled(tmp_path: Path, now: float, sent: int) -> bool:
    """`sent` delivered and every pending delivery deferred past `now` (so none in flight):
    with the clock held still, nothing more can happen."""
    db = sqlite3.connect(tmp_path / "outbox.sqlite")
    try:
        delivered = db.execute("SELECT COUNT(*) FROM deliveries WHERE state = 'delivered'").fetchone()[0]
    finally:
        db.close()
    return delivered == sent and all(due > now for due in _pending_due(tmp_path))


def test_retry_after_zero_waits_the_minimum_retry_delay(tmp_path: Path) -> None:
    """`Retry-After: 0` (taken as it is: 1,627 requests in 5 s) is floored at `min_retry_delay` (1 s):
    with the clock held still the alert is sent once while another alert put later is
    delivered; moving the clock by 1 s releases exactly one retry."""
    clock = FakeClock()

    def busy_once(request: Received, nth: int) -> Action:
        first_alert = request.body["commonLabels"]["template"] == template_label(1)
        return Reply(429, {"Retry-After": "0"}) if first_alert and nth == 1 else Reply()

    with Receiver(busy_once) as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery={"min_retry_delay": "1s"})
        outbox = _outbox(routes, clock)
        worker = DeliveryWorker(outbox, clock=clock)
        outbox.on_put = worker.wake
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            outbox.put([anomaly(template_id=1)])
            assert receiver.wait_for(lambda r: len(r.requests) == 1 and _settled(tmp_path, clock.now, sent=0))
            outbox.put([anomaly(template_id=2)])
            assert receiver.wait_for(lambda r: _settled(tmp_path, clock.now, sent=1), timeout=30)
            answers_before = [r.answer for r in receiver.requests]
            clock.advance(1.0)
            worker.wake()
            assert receiver.wait_for(lambda r: _settled(tmp_path, clock.now, sent=2), timeout=30)
        finally:
            stop.set()
            worker.wake()
            thread.join(30)
    assert answers_before == ["429", "200"]
    assert [r.answer for r in receiver.requests] == ["429", "200", "200"]
    first = outbox.attempts(receiver.requests[0].key)[0]
    assert first.retry_at is not None and first.retry_at - first.at == pytest.approx(1.0)


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
    # that date, unless the answer took so long that it is less than the floor away
    assert abs(first.retry_at - max(dates[0], first.at + MIN_RETRY_DELAY)) <= EPS
    assert second.started_at >= first.retry_at


def test_retries_give_up_after_the_limit_into_dead_letters(tmp_path: Path) -> None:
    """A receiver that never recovers: after `give_up_after` the delivery is dead-lettered.

    Each failed request moves the clock 10 s (and each reading 1 ms, so retries fall
    due): with give_up_after 35 s the 4th failure is the last, whatever the machine's speed."""
    clock = SteppingClock()

    def failing(_request: Received, _nth: int) -> Action:
        clock.advance(10.0)
        return Reply(500)

    with Receiver(failing) as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery={"give_up_after": "35s"})
        outbox = _outbox(routes, clock)
        outbox.put([anomaly()])
        assert drain(outbox, timeout=60, clock=clock) == 0
        attempts = len(receiver.requests)
    ((_key, _channel, status, reason),) = outbox.dead_letters()
    assert status == 500 and reason.startswith("gave up after 4 attempts")
    assert attempts == 4
