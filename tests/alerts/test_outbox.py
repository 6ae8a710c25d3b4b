"""The outbox's promises: durable on `put`, stable keys across restarts, in-order per incident,
bounded by its retention periods, fingerprints found through an index."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from alerts_support import FakeClock, anomaly, template_label, webhook, write_routes
from http_receivers import Action, Received, Receiver, Reply

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Delivery, Outbox, OutboxError, Outcome, find_incident, idempotency_key
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
    script = PUT_THEN_DIE.format(tests=str(Path(__file__).parents[1]), routes=str(routes))
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


def _settle_delivered(outbox: Outbox, now: float, keep_pending: Callable[[Delivery], bool]) -> None:
    """Mark every due delivery delivered at `now` (as a 2xx would), except `keep_pending` ones."""
    due = [d for d in outbox.claim(now, 100) if not keep_pending(d)]
    outbox.settle([Outcome(d, "delivered", now, started_at=now) for d in due])


def _group_templates(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {json.loads(data)["labels"]["template"] for (data,) in db.execute("SELECT data FROM groups")}
    finally:
        db.close()


def test_prune_removes_old_resolved_groups_but_never_open_or_undelivered_ones(tmp_path: Path) -> None:
    """After `resolved_retention`, prune deletes a resolved group whose deliveries are all
    gone; it keeps a group that still fires (however old its first anomaly) and a resolved one
    whose resolve notification is still pending."""
    clock = FakeClock()
    delivery = {"retention": "1h", "resolved_retention": "1h"}
    config = load_config(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery=delivery))
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    outbox.put([anomaly(template_id=i) for i in (1, 2, 3)])  # 1 resolves; 2 fires on; 3 resolves
    outbox.flush()
    _settle_delivered(outbox, clock.now, lambda d: False)
    for _ in range(6):  # three hours: template 2 every half hour, 1 and 3 resolve after 10 min
        clock.advance(1800)
        outbox.put([anomaly(template_id=2)])
        outbox.flush()
        _settle_delivered(outbox, clock.now, lambda d: d.alert.labels["template"] == template_label(3))
    assert outbox.prune(clock.now) > 0
    assert _group_templates(tmp_path / "outbox.sqlite") == {template_label(2), template_label(3)}


def test_group_opened_again_after_pruning_gets_a_dedup_key_never_used(tmp_path: Path) -> None:
    """A key whose resolved group was pruned opens a new group on its next anomaly, with a
    dedup key (and so idempotency keys) that its pruned incidents never had."""
    clock = FakeClock()
    delivery = {"retention": "1h", "resolved_retention": "1h"}
    config = load_config(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery=delivery))
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    keys = []
    for _ in range(2):  # two incidents of one key, each notified, resolved and delivered
        outbox.put([anomaly()])
        keys.extend(a.dedup_key for a in outbox.flush())
        _settle_delivered(outbox, clock.now, lambda d: False)
        clock.advance(3600)
        outbox.flush()
        _settle_delivered(outbox, clock.now, lambda d: False)
    clock.advance(7200)
    outbox.prune(clock.now)
    assert _rows(tmp_path / "outbox.sqlite", "SELECT COUNT(*) FROM groups") == 0
    outbox.put([anomaly()])
    [again] = outbox.flush()
    assert len(set(keys)) == 2 and again.dedup_key not in keys


def _incident_query_plans(outbox_path: Path, dedup_key: str) -> list[str]:
    """What SQLite does for each lookup (a SELECT with a WHERE) that `find_incident` runs on
    the groups table; a scan of every row has no WHERE and is listed, as [], by its absence."""
    db = sqlite3.connect(outbox_path, isolation_level=None)
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    try:
        assert find_incident(db, dedup_key) is not None
        db.set_trace_callback(None)
        lookups = [s for s in statements if s.startswith("SELECT") and "FROM groups WHERE" in s]
        return [" ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {s}")) for s in lookups]
    finally:
        db.close()


def test_fingerprint_lookup_reads_the_groups_index_not_every_row(tmp_path: Path) -> None:
    """`find_incident` (behind `logstream feedback --fingerprint`) finds a group among many
    through the index on dedup keys: SQLite's plan searches it, it scans no table."""
    config = load_config(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")]))
    outbox = Outbox(config.delivery.outbox, config)
    outbox.put([anomaly(template_id=i) for i in range(200)])
    wanted = outbox.flush()[137].dedup_key
    outbox.close()
    plans = _incident_query_plans(tmp_path / "outbox.sqlite", wanted)
    assert plans and all("USING INDEX groups_incident" in p and "SCAN" not in p for p in plans), plans


def test_outbox_of_an_older_release_gets_the_index_and_keeps_its_groups(tmp_path: Path) -> None:
    """An outbox of an older release, whose groups lack the dedup key and last-seen columns: the
    fingerprint lookup (feedback's own connection) adds them, filled from each row, and the
    index, and finds the incident; the outbox then prunes it like any other."""
    clock = FakeClock()
    delivery = {"retention": "1h", "resolved_retention": "1h"}
    config = load_config(write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery=delivery))
    outbox = Outbox(config.delivery.outbox, config, clock=clock)
    outbox.put([anomaly()])
    [alert] = outbox.flush()
    _settle_delivered(outbox, clock.now, lambda d: False)
    outbox.close()
    old = sqlite3.connect(tmp_path / "outbox.sqlite", isolation_level=None)
    for statement in (
        "DROP INDEX groups_incident", "DROP INDEX groups_resolved",
        "ALTER TABLE groups DROP COLUMN dedup_key", "ALTER TABLE groups DROP COLUMN last_seen",
    ):  # fmt: skip
        old.execute(statement)
    old.close()
    plans = _incident_query_plans(tmp_path / "outbox.sqlite", alert.dedup_key)
    assert plans and all("USING INDEX groups_incident" in p for p in plans), plans
    reopened = Outbox(config.delivery.outbox, config, clock=clock)
    clock.advance(3600)
    reopened.flush()  # resolved
    _settle_delivered(reopened, clock.now, lambda d: False)
    clock.advance(7200)
    reopened.prune(clock.now)
    assert _rows(tmp_path / "outbox.sqlite", "SELECT COUNT(*) FROM groups") == 0
