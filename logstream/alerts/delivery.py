"""The delivery worker: outbox -> channels over HTTP, with the retry rules.

Rules, per delivery (one alert to one channel):
- 2xx: delivered.
- 429: retry after `Retry-After` (seconds or an HTTP date, capped by
  `max_retry_after`), or after the backoff delay when the header is absent.
- 408, 5xx, timeouts, refused or dropped connections: retry after
  uniform(d * (1 - jitter), d), d = min(max, base * factor ** (failures - 1)).
  (A 503 with `Retry-After` is honoured like a 429.)
- any other status: dead letter, one warning log line, no retry.
- a delivery still failing `give_up_after` seconds after it was enqueued is
  dead-lettered too, so nothing retries forever.

- any other exception in an attempt (a response that does not decode, a
  row that does not render): retried on the backoff schedule, so one bad
  delivery can never end the worker.
- every retry waits at least `min_retry_delay` (`Retry-After: 0` included).

Rate limits are token buckets per channel; a delivery over the limit waits
(it is rescheduled, not counted as an attempt). Logs name the channel
(`receiver/kind/index`) and the alert's dedup key, never a URL or key.

The worker is supervised: an error in its loop (a locked database, a bug)
is logged (1st, 2nd, 4th, 8th ... consecutive time), and the loop restarts
after `restart_delay`, doubling up to `restart_delay_max`. Sends in flight
at a restart stay pending and go again with the same idempotency key.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from email.utils import parsedate_to_datetime

import httpx
import structlog

from logstream.alerts.channels import Channel, channels
from logstream.alerts.config import Backoff, RateLimit
from logstream.alerts.metrics import (
    ALERTS_SENT,
    NOTIFICATION_LATENCY,
    OUTBOX_PENDING,
    WORKER_RESTARTS,
    WORKER_UP,
)
from logstream.alerts.outbox import Delivery, Outbox, OutboxError, Outcome

log = structlog.get_logger(__name__)

PRUNE_EVERY = 600.0  # seconds (worker clock) between outbox prunes
MAX_RESPONSE_BYTES = 64 * 1024  # response body read (undecoded) to keep the connection; never used


def backoff_delay(failures: int, policy: Backoff, rng: random.Random) -> float:
    """Delay after the `failures`-th consecutive failure (1-based), jittered downwards."""
    ceiling = min(policy.max, policy.base * policy.factor ** (failures - 1))
    return rng.uniform(ceiling * (1.0 - policy.jitter), ceiling)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None


class TokenBucket:
    """`count` tokens per `per` seconds, starting full."""

    def __init__(self, limit: RateLimit, now: float) -> None:
        self._rate = limit.count / limit.per
        self._capacity = float(limit.count)
        self._tokens = float(limit.count)
        self._at = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 when granted, else the seconds until one is available."""
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate


class DeliveryWorker:
    """Sends due deliveries from a thread pool and records each outcome in the outbox.

    One loop thread owns the outbox bookkeeping (flush timers, claim, settle in
    batches); `concurrency` pool threads only do HTTP. (httpx's sync client in
    threads sustains several times the request rate of its asyncio client here.)
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.outbox = outbox
        self.policy = outbox.config.delivery
        self.channels: dict[str, Channel] = channels(outbox.config)
        self.clock = clock
        self.rng = rng or random.Random()
        self.failures = 0  # consecutive failed loop runs; 0 once an iteration completes
        self.running = False
        self._buckets: dict[str, TokenBucket] = {}
        self._wake = threading.Event()
        self._drain_deadline: float | None = None  # time.monotonic(); set by drain()
        self._next_prune = float("-inf")

    def wake(self) -> None:
        """Thread-safe nudge (the outbox calls it after `put`): look for work now."""
        self._wake.set()

    def drain(self, grace: float) -> None:
        """Thread-safe: finish up. The loop returns once nothing is in flight and nothing
        pending falls due within `grace` seconds, or when `grace` has passed."""
        self._drain_deadline = time.monotonic() + grace
        self._wake.set()

    def run(self, stop: threading.Event, *, until_idle: bool = False) -> None:
        """Deliver until `stop` is set (or, with `until_idle`, until nothing is pending;
        or, after `drain`, until drained). Any error in the loop restarts it (see the
        module docstring): this returns only when asked to.

        On stop, sends still in flight are abandoned, not recorded: they stay
        pending and are sent again (same idempotency key) by the next run."""
        while not stop.is_set():
            try:
                self.running = True
                self._loop(stop, until_idle)
                return
            except Exception as exc:  # the worker must outlive any one error
                self.running = False
                self.failures += 1
                WORKER_RESTARTS.inc()
                delay = min(
                    self.policy.restart_delay_max,
                    self.policy.restart_delay * 2.0 ** min(self.failures - 1, 30),
                )
                if self.failures & (self.failures - 1) == 0:  # a power of two: bounded logging
                    log.error(
                        "delivery_worker_failed", error=_describe(exc),
                        consecutive_failures=self.failures, restart_in_s=round(delay, 3),
                    )  # fmt: skip
                if self._drain_deadline is not None and time.monotonic() + delay > self._drain_deadline:
                    return  # shutting down: what is pending stays in the outbox
                stop.wait(delay)
            finally:
                self.running = False

    def _loop(self, stop: threading.Event, until_idle: bool) -> None:
        limits = httpx.Limits(
            max_connections=self.policy.concurrency,
            max_keepalive_connections=self.policy.concurrency,
        )
        in_flight: dict[int, Future[Outcome]] = {}
        pool = ThreadPoolExecutor(self.policy.concurrency, thread_name_prefix="alert-send")
        with httpx.Client(limits=limits, follow_redirects=False) as client:
            try:
                while not stop.is_set():
                    self._wake.clear()  # anything from here on (a put, a finished send) wakes _wait
                    now = self.clock()
                    self._prune(now)
                    self.outbox.flush(now)
                    self._start(pool, client, now, in_flight)
                    if not in_flight:  # only then can it be idle; count sparingly
                        pending = self.outbox.pending()
                        OUTBOX_PENDING.set(pending)
                        if (until_idle and pending == 0) or self._drained(now, pending):
                            return
                    elif self._drain_left() == 0.0:
                        return  # grace over: in-flight sends stay pending
                    self._wait(now, in_flight)
                    self._recovered()
            finally:
                pool.shutdown(wait=False, cancel_futures=True)

    def _recovered(self) -> None:
        if self.failures:
            log.info("delivery_worker_recovered", after_failures=self.failures)
            self.failures = 0

    def _drain_left(self) -> float | None:
        """Seconds of drain grace left (None when not draining)."""
        if self._drain_deadline is None:
            return None
        return max(0.0, self._drain_deadline - time.monotonic())

    def _drained(self, now: float, pending: int) -> bool:
        """Draining, and nothing more can go out within the grace."""
        left = self._drain_left()
        if left is None:
            return False
        if left == 0.0 or pending == 0:
            return True
        due = self.outbox.next_attempt()
        return due is None or due > now + left

    def _prune(self, now: float) -> None:
        if now >= self._next_prune:
            self.outbox.prune(now)
            self._next_prune = now + PRUNE_EVERY

    def _start(
        self,
        pool: ThreadPoolExecutor,
        client: httpx.Client,
        now: float,
        in_flight: dict[int, Future[Outcome]],
    ) -> None:
        free = self.policy.concurrency - len(in_flight)
        if free <= 0:
            return
        deferred = []
        for delivery in self.outbox.claim(now, free, busy=in_flight):
            wait = self._bucket(delivery.channel, now)
            if wait > 0:
                ALERTS_SENT.labels(self._kind(delivery), "deferred").inc()
                deferred.append(Outcome(delivery, "deferred", now, retry_at=now + wait))
                continue
            future = pool.submit(self._attempt, client, delivery)
            future.add_done_callback(lambda _f: self._wake.set())
            in_flight[delivery.id] = future
        self.outbox.settle(deferred)

    def _wait(self, now: float, in_flight: dict[int, Future[Outcome]]) -> None:
        """Sleep until a send finishes, a put arrives or something falls due; settle what finished."""
        if not any(f.done() for f in in_flight.values()):
            due = self.outbox.next_due(after=now)  # not what is in flight: no busy loop
            timeout = self.policy.poll_interval
            if due is not None:
                timeout = min(timeout, max(0.0, due - now))
            left = self._drain_left()
            if left is not None:
                timeout = min(timeout, left)
            self._wake.wait(timeout)
        finished = [i for i, f in in_flight.items() if f.done()]
        self.outbox.settle([in_flight.pop(i).result() for i in finished])

    def _bucket(self, channel: str, now: float) -> float:
        found = self.channels.get(channel)
        if found is None or found.config.rate_limit is None:
            return 0.0
        if channel not in self._buckets:
            self._buckets[channel] = TokenBucket(found.config.rate_limit, now)
        return self._buckets[channel].take(now)

    def _kind(self, delivery: Delivery) -> str:
        found = self.channels.get(delivery.channel)
        return found.kind if found is not None else "unknown"

    def _attempt(self, client: httpx.Client, delivery: Delivery) -> Outcome:
        """One send; never raises (a raise here would surface in the loop's settle)."""
        started = self.clock()
        try:
            return self._send(client, delivery, started)
        except Exception as exc:  # any failure of one attempt is a retry of it
            return self._retry(delivery, started, None, type(exc).__name__, None)

    def _send(self, client: httpx.Client, delivery: Delivery, started: float) -> Outcome:
        channel = self.channels.get(delivery.channel)
        if channel is None:
            return self._dead(delivery, started, started, None, "channel no longer configured")
        request = channel.render(delivery.alert, delivery.idem_key)
        try:
            timeout = channel.config.timeout
            # streamed and read raw: the status is the answer; a body we never use must
            # not fail the delivery (a 200 with a bogus Content-Encoding is still a 200)
            with client.stream(
                "POST", request.url, json=request.body, headers=request.headers, timeout=timeout
            ) as response:
                _skip_body(response)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # a config mistake
            return self._dead(delivery, started, self.clock(), None, type(exc).__name__)
        except httpx.TransportError as exc:  # timeouts, refused, reset, closed mid-response
            return self._retry(delivery, started, None, type(exc).__name__, None)
        status = response.status_code
        if 200 <= status < 300:
            ALERTS_SENT.labels(channel.kind, "delivered").inc()
            done = self.clock()
            NOTIFICATION_LATENCY.labels(channel.kind).observe(max(0.0, done - delivery.created_at))
            return Outcome(delivery, "delivered", done, started, status_code=status)
        if status in (408, 429) or status >= 500:
            after = response.headers.get("Retry-After") if status in (429, 503) else None
            return self._retry(delivery, started, status, f"HTTP {status}", after)
        return self._dead(delivery, started, self.clock(), status, f"HTTP {status}")

    def _retry(
        self,
        delivery: Delivery,
        started: float,
        status: int | None,
        error: str,
        retry_after_header: str | None,
    ) -> Outcome:
        now = self.clock()
        failures = delivery.attempts + 1
        retry_after = parse_retry_after(retry_after_header, now)
        if retry_after is not None:
            delay = min(retry_after, self.policy.max_retry_after)
        else:
            delay = backoff_delay(failures, self.policy.backoff, self.rng)
        delay = max(delay, self.policy.min_retry_delay)
        if now + delay > delivery.created_at + self.policy.give_up_after:
            reason = f"gave up after {failures} attempts: {error}"
            return self._dead(delivery, started, now, status, reason)
        ALERTS_SENT.labels(self._kind(delivery), "retry").inc()
        log.debug(
            "alert_retry", channel=delivery.channel, alert_id=delivery.alert.dedup_key,
            error=error, attempt=failures, delay_s=round(delay, 3),
        )  # fmt: skip
        return Outcome(delivery, "retry", now, started, retry_at=now + delay, status_code=status, error=error)

    def _dead(
        self, delivery: Delivery, started: float, now: float, status: int | None, reason: str
    ) -> Outcome:
        ALERTS_SENT.labels(self._kind(delivery), "dead").inc()
        log.warning(
            "alert_dead_lettered", channel=delivery.channel, alert_id=delivery.alert.dedup_key,
            idempotency_key=delivery.idem_key, status=status, reason=reason,
        )  # fmt: skip
        return Outcome(delivery, "dead", now, started, status_code=status, error=reason)


def _skip_body(response: httpx.Response) -> None:
    """Read up to MAX_RESPONSE_BYTES of the body undecoded (so the connection can be reused)."""
    read = 0
    for chunk in response.iter_raw():
        read += len(chunk)
        if read > MAX_RESPONSE_BYTES:
            break  # closing an unfinished response drops the connection, which is fine


def _describe(exc: BaseException) -> str:
    """An error for the log: the type, plus the message for outbox/SQLite errors (those
    carry no secret; an arbitrary exception might echo a URL, so its text is left out)."""
    if isinstance(exc, OutboxError | sqlite3.Error):
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__


class BackgroundDelivery:
    """Runs a DeliveryWorker in a daemon thread (for serve); reports it on the
    `logstream_delivery_worker_up` gauge."""

    def __init__(self, worker: DeliveryWorker) -> None:
        self.worker = worker
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=worker.run, args=(self._stop,), name="alert-delivery", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        WORKER_UP.set_function(lambda: 1.0 if self.up() else 0.0)

    def up(self) -> bool:
        """The loop is running and its last iteration completed."""
        return self._thread.is_alive() and self.worker.running and self.worker.failures == 0

    def healthy(self) -> bool:
        """Up, or restarting after fewer than `unhealthy_after` consecutive failures."""
        return self._thread.is_alive() and self.worker.failures < self.worker.policy.unhealthy_after

    def stop(self, grace: float = 0.0) -> None:
        """Keep delivering what falls due for up to `grace` seconds, then stop; sends still
        in flight stay pending in the outbox (the next process sends them)."""
        if grace > 0:
            self.worker.drain(grace)
            self._thread.join(grace)
        self._stop.set()
        self.worker.wake()
        self._thread.join(10.0)
