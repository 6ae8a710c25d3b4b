"""The durable outbox (SQLite, WAL): group state, deliveries, dead letters, attempts.

`put` routes anomalies and folds them into their groups in one transaction;
when it returns the groups are committed, so a source may commit its offsets
(it is the pipeline's `AnomalySink`). `flush(now)` turns due groups into
deliveries, one per channel of the receiver, each with an idempotency key
made from the incident's dedup key, the notification number and the channel:
the same on every restart, because it is derived from committed state.

Delivery is at-least-once: a delivery is marked delivered only after the
receiver said 2xx, so a crash between the two re-sends it with the same key.
Deliveries for one (channel, dedup_key) go out in order (a resolve never
overtakes its trigger).

With an incident memory (`incidents`, logstream.memory.recorder), every group a `put` or a
flush committed is recorded there (still under the outbox's lock, so no flush can notify a
group before its incident is kept), and each firing notification carries the past
incidents most like its incident (`Alert.past_incidents`), stored with the delivery so that
a retry sends the same payload.

Disk stays bounded: the worker prunes delivered rows after `delivery.retention`, dead
letters after `dead_retention`, and resolved groups whose last anomaly is older than
`resolved_retention` once none of their deliveries is left (and the incident memory its
incidents past its retention). A fingerprint lookup
(`find_incident`) reads one row through an index on the groups' dedup keys.

SQLite failures a caller can act on (a corrupt or locked file, a full disk)
are raised as `OutboxError`, one line naming the file and the reason. A row
that no longer decodes is set aside (dead-lettered or parked, with an error
log line) so that it cannot stop the worker again and again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from logstream.alerts.alert import Alert, shallow_dict
from logstream.alerts.channels import channels
from logstream.alerts.config import AlertsConfig, Silence
from logstream.alerts.grouping import NEVER, Group, absorb, evaluate
from logstream.alerts.matchers import matches
from logstream.alerts.metrics import OUTBOX_PRUNED
from logstream.alerts.routing import Timing, anomaly_labels, group_key, route
from logstream.alerts.silences import SILENCES_SCHEMA, LegacyFile, SilenceTable, silenced_by
from logstream.errors import UserError
from logstream.records import Anomaly

log = structlog.get_logger(__name__)

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS groups (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    next_eval REAL NOT NULL,
    data TEXT NOT NULL,
    dedup_key TEXT,
    last_seen REAL
);
CREATE INDEX IF NOT EXISTS groups_due ON groups (next_eval);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY,
    idem_key TEXT NOT NULL UNIQUE,
    channel TEXT NOT NULL,
    dedup_key TEXT NOT NULL,
    alert TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    delivered_at REAL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_attempt_at, id);
CREATE INDEX IF NOT EXISTS deliveries_order ON deliveries (channel, dedup_key, state, id);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    idem_key TEXT NOT NULL,
    channel TEXT NOT NULL,
    alert TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    status_code INTEGER,
    reason TEXT NOT NULL,
    failed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    delivery_id INTEGER NOT NULL,
    idem_key TEXT NOT NULL,
    started_at REAL NOT NULL,
    at REAL NOT NULL,
    outcome TEXT NOT NULL,
    status_code INTEGER,
    retry_at REAL
);
CREATE INDEX IF NOT EXISTS attempts_delivery ON attempts (delivery_id, at);
CREATE INDEX IF NOT EXISTS deliveries_incident ON deliveries (dedup_key);
"""
    + SILENCES_SCHEMA
)
# on the columns that files of older releases lack until `_add_group_columns` ran
GROUP_INDEXES = """
CREATE INDEX IF NOT EXISTS groups_incident ON groups (dedup_key);
CREATE INDEX IF NOT EXISTS groups_resolved ON groups (state, last_seen);
"""

FLUSH_BATCH = 1000  # groups evaluated per flush call
_DUE = "next_eval <= ?"
_EARLY = "(next_eval <= ? OR state = 'pending')"
_BAD_ROW = (ValueError, KeyError, TypeError)  # what decoding a damaged JSON row raises
Inhibitors = dict[tuple[str, ...], list[tuple[str, float]]]  # equal-label values -> (group key, resolves at)


class OutboxError(UserError, RuntimeError):
    """The outbox database cannot be used (corrupt, locked, disk full ...); one line."""


@contextmanager
def _sqlite_errors(path: str | Path) -> Iterator[None]:
    """sqlite3 errors -> OutboxError naming the file (no traceback for the operator)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise OutboxError(f"alert outbox {path}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Delivery:
    """One alert to one channel, as claimed by the worker."""

    id: int
    idem_key: str
    channel: str
    alert: Alert
    attempts: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a delivery attempt. `kind`: delivered | retry | dead | deferred.

    `deferred` (rate limited before sending) moves `next_attempt_at` without
    counting an attempt."""

    delivery: Delivery
    kind: str
    at: float  # when the outcome was known
    started_at: float | None = None  # when the request started (None when deferred)
    retry_at: float | None = None
    status_code: int | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One recorded attempt: started, outcome known at `at`, next try not before `retry_at`."""

    started_at: float
    at: float
    outcome: str
    status_code: int | None
    retry_at: float | None


class IncidentLog(Protocol):
    """The incident memory as the outbox sees it (logstream.memory.recorder); it never raises."""

    def changed(self, groups: Sequence[tuple[Group, Sequence[Anomaly]]]) -> None:
        """Groups just committed, each with the anomalies that were new distinct alerts in it."""

    def past(self, fingerprints: Sequence[str]) -> list[tuple[dict[str, Any], ...]]:
        """For each incident (a group's dedup key), the past incidents most like it, as its
        alert carries them."""

    def prune(self) -> None:
        """Delete the incidents past the memory's retention."""


def channel_names(config: AlertsConfig, receiver: str) -> list[tuple[str, bool]]:
    """(channel name, send_resolved) for each channel config of a receiver, in file order."""
    return [(c.name, c.config.send_resolved) for c in channels(config).values() if c.receiver == receiver]


def idempotency_key(dedup_key: str, sequence: int, channel: str) -> str:
    return hashlib.sha256(f"{dedup_key}:{sequence}:{channel}".encode()).hexdigest()[:32]


class Outbox:
    """SQLite outbox shared by the sink (`put`) and the delivery worker (thread-safe)."""

    def __init__(
        self,
        path: str | Path,
        config: AlertsConfig,
        *,
        clock: Callable[[], float] = time.time,
        on_put: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.path = str(path)
        self.clock = clock
        self.on_put = on_put
        self.incidents: IncidentLog | None = None  # set by the sink that opens the memory
        self._lock = threading.Lock()
        self._legacy_silences = LegacyFile(config.silences_file, config.label_names)
        timeout = config.delivery.lock_timeout
        if self.path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutboxError(f"alert outbox {path}: cannot create its folder: {exc.strerror}") from None
        # Two connections, one lock: `put` commits at the configured durability (FULL:
        # fsync per put, what lets a source commit its offsets); the worker's own writes
        # (timers fired, outcomes) use NORMAL, since losing one to a power cut only means
        # a timer re-fires or a delivery is re-sent with the same idempotency key.
        with _sqlite_errors(path):
            self._db = _connect(path, config.delivery.synchronous, timeout)
            self._wdb = self._db if self.path == ":memory:" else _connect(path, "normal", timeout)
        self._import_legacy_silences()

    # -- the sink side ---------------------------------------------------------------

    def put(self, anomalies: Sequence[Anomaly]) -> None:
        """Fold anomalies into their groups; committed (fsynced) when this returns."""
        if not anomalies:
            return
        now = self.clock()
        with _sqlite_errors(self.path), self._lock:
            with self._transaction(self._db):
                touched: dict[str, Group] = {}
                fresh: dict[str, list[Anomaly]] = {}  # group key -> its new distinct alerts
                for anomaly in anomalies:
                    labels = anomaly_labels(anomaly)
                    for match in route(self.config, labels, anomaly.score):
                        key = group_key(match, labels)
                        held = touched[key] if key in touched else self._load(key)
                        group = touched[key] = absorb(held, anomaly, labels, match, key, now)
                        if _new_distinct(held, group):
                            fresh.setdefault(key, []).append(anomaly)
                self._db.executemany(
                    "INSERT OR REPLACE INTO groups (key, state, next_eval, data, dedup_key, last_seen)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (g.key, g.state, g.next_eval, _dump_group(g), g.dedup_key, g.last_seen)
                        for g in touched.values()
                    ],
                )
            if self.incidents is not None:
                self.incidents.changed([(g, fresh.get(key, ())) for key, g in touched.items()])
        if self.on_put is not None:
            self.on_put()

    def incident_of(self, anomaly: Anomaly) -> str | None:
        """The fingerprint (dedup key) of the incident an anomaly is part of now: its first
        route's group's; None when it matched no route."""
        labels = anomaly_labels(anomaly)
        matched = route(self.config, labels, anomaly.score)
        if not matched:
            return None
        with _sqlite_errors(self.path), self._lock:
            group = self._load(group_key(matched[0], labels))
        return group.dedup_key if group is not None else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._wdb.close()

    # -- silences (see logstream.alerts.silences) -------------------------------------

    def add_silence(self, silence: Silence) -> None:
        """Store a silence (durable on return); the next evaluation obeys it."""
        with _sqlite_errors(self.path), self._lock, self._transaction(self._db):
            SilenceTable(self._db).add(silence, self.clock())

    def silences(self, *, expired: bool = False) -> list[Silence]:
        """Stored silences in effect or yet to start (and expired ones with `expired`)."""
        self._import_legacy_silences()
        with _sqlite_errors(self.path), self._lock:
            return SilenceTable(self._wdb).listed(self.clock(), expired=expired)

    def expire_silence(self, silence_id: str) -> bool:
        """End a stored silence now; False when none with this id is in effect."""
        with _sqlite_errors(self.path), self._lock, self._transaction(self._db):
            return SilenceTable(self._db).expire(silence_id, self.clock())

    def _import_legacy_silences(self) -> None:
        """An older release's silences_file, imported when it changed (content ids: no repeats)."""
        found = self._legacy_silences.changed()
        if found:
            with _sqlite_errors(self.path), self._lock, self._transaction(self._wdb):
                table = SilenceTable(self._wdb)
                for silence in found:
                    table.add(silence, self.clock(), replace=False)
            log.info("silences_file_imported", silences=len(found), path=str(self._legacy_silences.path))

    # -- grouping timers ------------------------------------------------------------

    def flush(self, now: float | None = None, *, early: bool = False) -> list[Alert]:
        """Evaluate due groups; enqueue a delivery per channel for each notification made.

        `early` (on shutdown) also notifies groups still inside `group_wait` now, rather
        than leave them to a process that may never come (an emptyDir outbox)."""
        now = self.clock() if now is None else now
        due = _EARLY if early else _DUE
        self._import_legacy_silences()
        with self._lock:
            if not self._wdb.execute(f"SELECT 1 FROM groups WHERE {due}", (now,)).fetchone():
                return []  # nothing due: no write transaction
            silences = [*self.config.silences, *SilenceTable(self._wdb).active(now)]
            made, changed = self._flush(now, silences, early)
            if self.incidents is not None and changed:  # after the commit: the memory writes the file too
                self.incidents.changed([(group, ()) for group in changed])
            return made

    def _flush(self, now: float, silences: list[Silence], early: bool) -> tuple[list[Alert], list[Group]]:
        """(the notifications made, the groups whose state changed), committed."""
        resolve_timeout = self.config.global_.resolve_timeout
        notify: list[tuple[Group, str]] = []
        changed: list[Group] = []
        with self._transaction(self._wdb):
            sources = self._inhibit_sources(resolve_timeout, now) if self.config.inhibit_rules else []
            rows = self._wdb.execute(
                f"SELECT key, data FROM groups WHERE {_EARLY if early else _DUE} ORDER BY next_eval LIMIT ?",
                (now, FLUSH_BATCH),
            ).fetchall()
            for key, data in rows:
                try:
                    group = _load_group(data)
                except _BAD_ROW as exc:  # park it: re-reading it every flush would stop the worker
                    log.error("alert_group_unreadable", group=key, error=type(exc).__name__)
                    self._wdb.execute("UPDATE groups SET next_eval = ? WHERE key = ?", (NEVER, key))
                    continue
                silence = silenced_by(silences, group.labels, now)
                mutes = [silence.expires_at] if silence is not None else []
                inhibited = self._inhibited_until(group, sources) if sources else None
                if inhibited is not None:
                    mutes.append(inhibited)
                until = min(mutes) if mutes else None  # re-evaluated when the first one ends
                state = group.state
                group, status = evaluate(group, now, resolve_timeout, until, early=early)
                if group.state != state:
                    changed.append(group)
                self._wdb.execute(
                    "UPDATE groups SET state = ?, next_eval = ?, data = ?, dedup_key = ?, last_seen = ?"
                    " WHERE key = ?",
                    (
                        group.state,
                        group.next_eval,
                        _dump_group(group),
                        group.dedup_key,
                        group.last_seen,
                        group.key,
                    ),
                )
                if status is None:
                    if silence is not None:
                        log.info("alert_silenced", alert_id=group.dedup_key, comment=silence.comment)
                    elif inhibited is not None:
                        log.info("alert_inhibited", alert_id=group.dedup_key)
                    continue
                notify.append((group, status))
            made = self._notifications(notify, resolve_timeout)
            for alert in made:
                self._enqueue(alert, now)
        return made, changed

    def _notifications(self, notify: list[tuple[Group, str]], resolve_timeout: float) -> list[Alert]:
        """The alerts of the groups notified, in order; firing ones with their past incidents
        (looked up together: the verdicts are read once)."""
        firing = [group for group, status in notify if status == "firing"]
        past = {}
        if self.incidents is not None and firing:
            found = self.incidents.past([group.dedup_key for group in firing])
            past = {group.key: incidents for group, incidents in zip(firing, found, strict=True)}
        return [
            Alert.of(group, status, resolve_timeout, self.config.links, past.get(group.key, ()))
            for group, status in notify
        ]

    def _inhibit_sources(self, resolve_timeout: float, now: float) -> list[Inhibitors]:
        """Per inhibit rule: the open groups (not yet due to resolve) that match its source
        matchers, by their values of its `equal` labels, as (key, resolves at)."""
        open_groups = []
        for key, data in self._wdb.execute("SELECT key, data FROM groups WHERE state != 'resolved'"):
            try:
                group = _load_group(data)
            except _BAD_ROW:
                continue  # parked when it is evaluated (see _flush)
            if group.last_seen + resolve_timeout > now:
                open_groups.append((key, group.labels, group.last_seen + resolve_timeout))
        out: list[Inhibitors] = []
        for rule in self.config.inhibit_rules:
            by_equal: Inhibitors = {}
            for key, labels, resolves_at in open_groups:
                if matches(rule.source_matchers, labels):
                    values = tuple(labels.get(n, "") for n in rule.equal)
                    by_equal.setdefault(values, []).append((key, resolves_at))
            out.append(by_equal)
        return out

    def _inhibited_until(self, group: Group, sources: Sequence[Inhibitors]) -> float | None:
        """When the last open group inhibiting this one (see config.InhibitRule) resolves."""
        until = None
        for rule, by_equal in zip(self.config.inhibit_rules, sources, strict=True):
            if not by_equal or not matches(rule.target_matchers, group.labels):
                continue
            values = tuple(group.labels.get(n, "") for n in rule.equal)
            for key, resolves_at in by_equal.get(values, ()):
                if key != group.key:
                    until = resolves_at if until is None else max(until, resolves_at)
        return until

    def _enqueue(self, alert: Alert, now: float) -> None:
        channels = channel_names(self.config, alert.receiver)
        if not channels:
            log.warning("alert_receiver_gone", alert_id=alert.dedup_key, receiver=alert.receiver)
        body = alert.to_json()
        self._wdb.executemany(
            "INSERT OR IGNORE INTO deliveries"
            " (idem_key, channel, dedup_key, alert, created_at, next_attempt_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (idempotency_key(alert.dedup_key, alert.sequence, name), name,
                 alert.dedup_key, body, now, now)
                for name, send_resolved in channels
                if alert.status == "firing" or send_resolved
            ],
        )  # fmt: skip

    # -- the worker side ------------------------------------------------------------

    def claim(self, now: float, limit: int, busy: Iterable[int] = ()) -> list[Delivery]:
        """Due deliveries, oldest first, skipping `busy` ids and any whose (channel,
        dedup_key) has an earlier pending delivery (kept in order per incident)."""
        busy = set(busy)
        with self._lock:
            rows = self._wdb.execute(
                "SELECT d.id, d.idem_key, d.channel, d.alert, d.attempts, d.created_at"
                " FROM deliveries d WHERE d.state = 'pending' AND d.next_attempt_at <= ?"
                " AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.channel = d.channel"
                "   AND e.dedup_key = d.dedup_key AND e.state = 'pending' AND e.id < d.id)"
                " ORDER BY d.next_attempt_at, d.id LIMIT ?",
                (now, limit + len(busy)),
            ).fetchall()
        out: list[Delivery] = []
        for r in rows:
            if r[0] in busy:
                continue
            try:
                alert = Alert.from_json(r[3])
            except _BAD_ROW as exc:
                self._set_aside(r[0], r[1], r[2], r[3], r[4], type(exc).__name__, now)
                continue
            out.append(Delivery(id=r[0], idem_key=r[1], channel=r[2], alert=alert,
                                attempts=r[4], created_at=r[5]))  # fmt: skip
        return out[:limit]

    def _set_aside(
        self, id_: int, idem_key: str, channel: str, raw: str, attempts: int, error: str, now: float
    ) -> None:
        """Dead-letter a delivery whose stored alert does not decode (it could never be sent)."""
        log.error("alert_row_unreadable", channel=channel, idempotency_key=idem_key, error=error)
        with self._lock, self._transaction(self._wdb):
            self._wdb.execute(
                "INSERT INTO dead_letters (idem_key, channel, alert, attempts, status_code,"
                " reason, failed_at) VALUES (?, ?, ?, ?, NULL, ?, ?)",
                (idem_key, channel, raw, attempts, f"unreadable outbox row: {error}", now),
            )
            self._wdb.execute("DELETE FROM deliveries WHERE id = ?", (id_,))

    def settle(self, outcomes: Sequence[Outcome]) -> None:
        """Record a batch of attempt outcomes in one transaction."""
        if not outcomes:
            return
        with self._lock, self._transaction(self._wdb):
            for o in outcomes:
                d = o.delivery
                if o.kind == "deferred":
                    self._wdb.execute(
                        "UPDATE deliveries SET next_attempt_at = ? WHERE id = ?", (o.retry_at, d.id)
                    )
                    continue
                self._wdb.execute(
                    "INSERT INTO attempts (delivery_id, idem_key, started_at, at, outcome,"
                    " status_code, retry_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (d.id, d.idem_key, o.started_at, o.at, o.kind, o.status_code, o.retry_at),
                )
                if o.kind == "delivered":
                    self._wdb.execute(
                        "UPDATE deliveries SET state = 'delivered', delivered_at = ?,"
                        " attempts = attempts + 1 WHERE id = ?",
                        (o.at, d.id),
                    )
                elif o.kind == "retry":
                    self._wdb.execute(
                        "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?,"
                        " last_error = ? WHERE id = ?",
                        (o.retry_at, o.error, d.id),
                    )
                else:
                    self._wdb.execute(
                        "INSERT INTO dead_letters (idem_key, channel, alert, attempts,"
                        " status_code, reason, failed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (d.idem_key, d.channel, d.alert.to_json(), d.attempts + 1,
                         o.status_code, o.error, o.at),
                    )  # fmt: skip
                    self._wdb.execute("DELETE FROM deliveries WHERE id = ?", (d.id,))

    def restamp_pending(self, now: float) -> None:
        """Make every pending delivery due, and age, from `now` (replay: they were made on
        event time, which may lie in the past or the future)."""
        with self._lock, self._transaction(self._wdb):
            self._wdb.execute(
                "UPDATE deliveries SET created_at = ?, next_attempt_at = ? WHERE state = 'pending'",
                (now, now),
            )

    def prune(self, now: float) -> int:
        """Delete delivered rows older than `retention` and dead letters older than
        `dead_retention`, with their attempts, and resolved groups whose last anomaly is older
        than `resolved_retention` and none of whose deliveries is left (pending or still
        kept); returns how many rows went."""
        policy = self.config.delivery
        delivered_before, dead_before = now - policy.retention, now - policy.dead_retention
        with self._lock, self._transaction(self._wdb):
            self._wdb.execute(
                "DELETE FROM attempts WHERE delivery_id IN (SELECT id FROM deliveries"
                " WHERE state = 'delivered' AND delivered_at < ?)",
                (delivered_before,),
            )
            delivered = self._wdb.execute(
                "DELETE FROM deliveries WHERE state = 'delivered' AND delivered_at < ?",
                (delivered_before,),
            ).rowcount
            dead = self._wdb.execute("DELETE FROM dead_letters WHERE failed_at < ?", (dead_before,)).rowcount
            # attempts of dead-lettered deliveries (their delivery row is gone already)
            self._wdb.execute(
                "DELETE FROM attempts WHERE at < ? AND delivery_id NOT IN (SELECT id FROM deliveries)",
                (dead_before,),
            )
            resolved = self._wdb.execute(
                "DELETE FROM groups WHERE state = 'resolved' AND last_seen < ? AND NOT EXISTS"
                " (SELECT 1 FROM deliveries d WHERE d.dedup_key = groups.dedup_key)",
                (now - policy.resolved_retention,),
            ).rowcount
        OUTBOX_PRUNED.labels("delivered").inc(delivered)
        OUTBOX_PRUNED.labels("dead").inc(dead)
        OUTBOX_PRUNED.labels("resolved").inc(resolved)
        if self.incidents is not None:
            self.incidents.prune()
        return delivered + dead + resolved

    def next_attempt(self) -> float | None:
        """Earliest moment a pending delivery falls due (group timers not included)."""
        with self._lock:
            return self._wdb.execute(
                "SELECT MIN(next_attempt_at) FROM deliveries WHERE state = 'pending'"
            ).fetchone()[0]

    def next_eval(self) -> float | None:
        """Earliest group timer (a first notification, repeat or resolve)."""
        with self._lock:
            return self._wdb.execute("SELECT MIN(next_eval) FROM groups").fetchone()[0]

    def next_due(self, after: float = float("-inf")) -> float | None:
        """Earliest time anything (a group timer or a delivery) becomes due; deliveries due
        at or before `after` are left out (after a claim those are in flight or blocked
        behind one, and only a finished send, which wakes the worker, can free them)."""
        with self._lock:
            b = self._wdb.execute(
                "SELECT MIN(next_attempt_at) FROM deliveries WHERE state = 'pending' AND next_attempt_at > ?",
                (after,),
            ).fetchone()[0]
        times = [t for t in (self.next_eval(), b) if t is not None]
        return min(times) if times else None

    def pending(self) -> int:
        """Deliveries not yet delivered or dead-lettered."""
        with self._lock:
            row = self._wdb.execute("SELECT COUNT(*) FROM deliveries WHERE state = 'pending'")
            return int(row.fetchone()[0])

    def dead_letters(self) -> list[tuple[str, str, int | None, str]]:
        """(idem_key, channel, status_code, reason) of each dead-lettered delivery."""
        with self._lock:
            rows = self._wdb.execute(
                "SELECT idem_key, channel, status_code, reason FROM dead_letters ORDER BY id"
            ).fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def attempts(self, idem_key: str) -> list[Attempt]:
        """Each attempt of one delivery, in order."""
        with self._lock:
            rows = self._wdb.execute(
                "SELECT started_at, at, outcome, status_code, retry_at FROM attempts"
                " WHERE idem_key = ? ORDER BY started_at",
                (idem_key,),
            ).fetchall()
        return [Attempt(*r) for r in rows]

    def delivered_keys(self) -> set[str]:
        """Idempotency keys of deliveries the receivers acknowledged."""
        with self._lock:
            rows = self._wdb.execute("SELECT idem_key FROM deliveries WHERE state = 'delivered'")
            return {r[0] for r in rows.fetchall()}

    # -- helpers --------------------------------------------------------------------

    def _load(self, key: str) -> Group | None:
        row = self._db.execute("SELECT data FROM groups WHERE key = ?", (key,)).fetchone()
        return _load_group(row[0]) if row else None

    def _transaction(self, db: sqlite3.Connection) -> _Transaction:
        return _Transaction(db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error (the connection is in autocommit)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _connect(path: str | Path, synchronous: str, timeout: float) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=timeout)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    db.executescript(SCHEMA)
    _add_group_columns(db)
    return db


def _add_group_columns(db: sqlite3.Connection) -> None:
    """Give a groups table of an older release its `dedup_key` and `last_seen` columns, filled
    from each row's data (a row that does not decode keeps NULLs: it is never found by
    fingerprint nor pruned), then the indexes on them. Idempotent; in one transaction, so two
    processes opening the same old file do not both migrate it."""
    if _lacks_group_columns(db):
        with _Transaction(db):
            if _lacks_group_columns(db):  # re-read under the write lock
                db.execute("ALTER TABLE groups ADD COLUMN dedup_key TEXT")
                db.execute("ALTER TABLE groups ADD COLUMN last_seen REAL")
                for key, data in db.execute("SELECT key, data FROM groups").fetchall():
                    try:
                        group = _load_group(data)
                    except _BAD_ROW:
                        continue
                    db.execute(
                        "UPDATE groups SET dedup_key = ?, last_seen = ? WHERE key = ?",
                        (group.dedup_key, group.last_seen, key),
                    )
    db.executescript(GROUP_INDEXES)


def _lacks_group_columns(db: sqlite3.Connection) -> bool:
    columns = {row[1] for row in db.execute("PRAGMA table_info(groups)")}
    return bool(columns) and "dedup_key" not in columns


def _new_distinct(held: Group | None, group: Group) -> bool:
    """Whether absorbing an anomaly into `held` opened an incident or added a distinct alert."""
    before = held.fingerprints if held is not None and held.dedup_key == group.dedup_key else ()
    return len(group.fingerprints) > len(before)


def _dump_group(group: Group) -> str:
    data = shallow_dict(group)
    data["timing"] = shallow_dict(group.timing)
    return json.dumps(data, separators=(",", ":"))


def _load_group(text: str) -> Group:
    data = json.loads(text)
    data["timing"] = Timing(**data["timing"])
    data.pop("top_tokens", None)  # BPE tokens, in rows that have them: `explanation` says it in words
    for name in ("fingerprints", "context_before", "context_after", "examples"):
        data[name] = tuple(data.get(name, ()))
    return Group(**data)


def find_incident(db: sqlite3.Connection, dedup_key: str) -> Group | None:
    """The stored group whose current incident has this dedup key (the fingerprint its alerts
    carry), if any: one indexed row, for operator commands (`logstream feedback
    --fingerprint`). A file of an older release gets its index first."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'groups'").fetchone():
        return None
    _add_group_columns(db)
    for (data,) in db.execute("SELECT data FROM groups WHERE dedup_key = ?", (dedup_key,)):
        try:
            return _load_group(data)
        except _BAD_ROW:
            continue  # parked when it is evaluated (see Outbox._flush)
    return None
