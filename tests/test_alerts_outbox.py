"""The outbox's promises: durable on `put`, stable keys across restarts, in-order per incident."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alerts_support import FakeClock, anomaly, template_label, webhook, write_routes
from http_receivers import Action, Received, Receiver, Reply

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox, idempotency_key
from logstream.alerts.pipeline import drain

PUT_THEN_DIE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from alerts_support import anomaly
from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
config = load_config({routes!r})
Outbox(config.delivery.outbox, config).put([anomaly(template_id=i) for i in range(5)])
os.kill(os.getpid(), signal.SIGKILL)  # no close, no cleanup: only what put committed survives
"""


class TickingClock(FakeClock):
    """Moves 1 s each time it is read, so retries scheduled on fake time fall due."""

    def __call__(self) -> float:
        self.advance(1.0)
        return self.now


def test_put_is_durable_when_it_returns(tmp_path: Path) -> None:
    """A process killed right after `put` returns loses none of the anomalies it put."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery={"synchronous": "full"})
    script = PUT_THEN_DIE.format(tests=str(Path(__file__).parent), routes=str(routes))
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=False)
    assert died.returncode == -9, died.stderr.decode()[-2000:]
    config = load_config(routes)
    alerts = Outbox(config.delivery.outbox, config).flush()
    assert sorted(a.labels["template"] for a in alerts) == sorted(template_label(i) for i in range(5))


def test_idempotency_keys_are_stable_across_restarts(tmp_path: Path) -> None:
    """Reopening the outbox yields the same pending deliveries with the same keys, no new ones."""
    config = load_config(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")]))
    first = Outbox(config.delivery.outbox, config)
    first.put([anomaly(template_id=1), anomaly(template_id=2)])
    made = first.flush()
    before = {d.idem_key for d in first.claim(first.clock(), 10)}
    first.close()
    again = Outbox(config.delivery.outbox, config)
    assert again.flush() == []
    after = {d.idem_key for d in again.claim(again.clock(), 10)}
    assert before == after == {idempotency_key(a.dedup_key, a.sequence, "team/webhook/0") for a in made}


def test_resolve_never_overtakes_a_retried_trigger(tmp_path: Path) -> None:
    """While the trigger is being retried the resolve waits: the receiver sees firing first."""
    clock = TickingClock()

    def fail_firing_twice(request: Received, nth: int) -> Action:
        return Reply(503) if request.body["status"] == "firing" and nth <= 2 else Reply()

    with Receiver(fail_firing_twice) as receiver:
        config = load_config(write_routes(tmp_path, [webhook("team", receiver.url)]))
        outbox = Outbox(config.delivery.outbox, config, clock=clock)
        outbox.put([anomaly()])
        outbox.flush()
        clock.advance(601)  # quiet past resolve_timeout: the resolve is enqueued too
        outbox.flush()
        assert outbox.pending() == 2
        assert drain(outbox, timeout=20, clock=clock) == 0
        statuses = [r.body["status"] for r in receiver.requests]
    assert statuses == ["firing", "firing", "firing", "resolved"]
