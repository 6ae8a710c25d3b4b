"""The outbox's promises: durable on `put`, stable keys across restarts, in-order per incident."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alerts_support import FakeClock, anomaly, template_label, webhook, write_routes
from http_receivers import Action, Received, Receiver, Reply

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox, OutboxError, idempotency_key
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


def _rows(path: Path, sql: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute(sql).fetchone()[0])
    finally:
        db.close()


def test_worker_prunes_delivered_rows_after_retention(tmp_path: Path) -> None:
    """Delivered rows (and their attempts) older than `retention` are deleted by the worker;
    a dead letter is kept until the longer `dead_retention`."""
    clock = FakeClock()

    def reject_template_2(request: Received, _nth: int) -> Action:
        return Reply(400) if request.body["commonLabels"]["template"] == template_label(2) else Reply()

    with Receiver(reject_template_2) as receiver:
        quiet = {
            "route": {"repeat_interval": "30d"},
            "global": {"resolve_timeout": "30d"},
        }  # no new notifications
        delivery = {"retention": "1d", "dead_retention": "3d"}
        config = load_config(
            write_routes(tmp_path, [webhook("team", receiver.url)], delivery=delivery, **quiet)
        )
        outbox = Outbox(config.delivery.outbox, config, clock=clock)
        outbox.put([anomaly(template_id=1), anomaly(template_id=2)])
        assert drain(outbox, timeout=30, clock=clock) == 0
        db = tmp_path / "outbox.sqlite"
        assert _rows(db, "SELECT COUNT(*) FROM deliveries") == 1 and len(outbox.dead_letters()) == 1
        clock.advance(86400 + 1)
        assert drain(outbox, timeout=30, clock=clock) == 0  # a fresh worker prunes at once
        pruned_delivered = _rows(db, "SELECT COUNT(*) FROM deliveries")
        dead_kept = len(outbox.dead_letters())
        clock.advance(2 * 86400)
        assert drain(outbox, timeout=30, clock=clock) == 0
    assert pruned_delivered == 0 and dead_kept == 1
    assert outbox.dead_letters() == [] and _rows(db, "SELECT COUNT(*) FROM attempts") == 0
    assert outbox.flush() == [] and _rows(db, "SELECT COUNT(*) FROM groups") == 2  # incidents kept


def test_corrupt_outbox_is_one_error_line(tmp_path: Path) -> None:
    """An outbox file that is not a database: `deliver` exits 2 with one line naming the
    file, no traceback."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    (tmp_path / "outbox.sqlite").write_bytes(b"this is not an SQLite database\n" * 200)
    cmd = [sys.executable, "-m", "logstream.alerts", "deliver", "--alerts", str(routes), "--until-idle"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: alert outbox {tmp_path / 'outbox.sqlite'}: file is not a database")


def test_locked_outbox_put_raises_outbox_error(tmp_path: Path) -> None:
    """`put` while another connection holds the write lock past `lock_timeout` raises
    OutboxError (what serve reports) naming the file and the reason."""
    routes = write_routes(
        tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery={"lock_timeout": "100ms"}
    )
    config = load_config(routes)
    outbox = Outbox(config.delivery.outbox, config)
    holder = sqlite3.connect(config.delivery.outbox, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OutboxError, match=r"alert outbox .*outbox\.sqlite: database is locked"):
            outbox.put([anomaly()])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outbox.put([anomaly()])  # usable again once the lock is gone
    assert len(outbox.flush()) == 1
