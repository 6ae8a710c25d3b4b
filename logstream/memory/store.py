"""Incidents kept: one row per alert group's incident, in the alert outbox's SQLite file.

An incident is what one alert fingerprint (the group's `dedup_key`) stands for: its
templates and example lines, the streams and the time range it covered, the model that
raised it (and that model's embedding of its lines), and the resolution an operator wrote
afterwards. Verdicts and comments are not copied here: they are `logstream feedback` rows
(the `feedback` table of the same file), found by the fingerprint they name or by a
template that covers the incident's (`verdicts_for`).

Why the outbox's file and not a file of its own: the incident is written where its group
is, so the pipeline can record it in the transaction that stores the group (no second
fsync, and no incident without its group after a crash); the fingerprint verdicts it shows
are in that file already; and there is one volume to mount and back up. Its tables are
separate b-trees, so their size does not slow the outbox's queries.

Bounded on disk and in memory: every field has a size limit (`MAX_*`), rows beyond
`max_incidents` are evicted as they come (closed incidents without a resolution first,
then closed ones, then open ones; oldest first), and `prune` deletes incidents not seen
for `retention`. SQLite reuses the pages of deleted rows, so the file stops growing once
the cap is reached.
"""

from __future__ import annotations

import fnmatch
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from logstream.errors import UserError
from logstream.lifecycle.feedback import (
    EVERY_STREAM,
    READ_TIMEOUT_SECONDS,
    Feedback,
    FeedbackStore,
    check,
    covers,
    effective,
)

if TYPE_CHECKING:
    from logstream.alerts.grouping import Group
    from logstream.records import Anomaly

MAX_TEMPLATES = 16  # distinct templates kept per incident (its first ones)
MAX_STREAMS = 16
MAX_EXAMPLES = 5  # the group's first line of each distinct alert (grouping.MAX_EXAMPLES)
MAX_TEXT = 1000  # characters kept of a template, an example line or a stream name
MAX_RESOLUTION = 4000
MAX_DIMENSIONS = 4096  # an embedding wider than any supported model's hidden size is refused
MAX_EMBEDDED = 5  # lines whose embeddings an incident's vector averages (its first distinct ones)

INCIDENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL UNIQUE,
    keep INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    data TEXT NOT NULL,
    space TEXT NOT NULL,
    embedding BLOB,
    resolution TEXT NOT NULL DEFAULT '',
    resolved_by TEXT NOT NULL DEFAULT '',
    resolved_at REAL
);
CREATE INDEX IF NOT EXISTS incidents_evict ON incidents (keep, last_seen);
CREATE INDEX IF NOT EXISTS incidents_seen ON incidents (last_seen);
"""
# `keep`: the eviction order under the cap (lowest first, then oldest last_seen)
CLOSED, RESOLVED, OPEN = 0, 1, 2
_BAD_ROW = (ValueError, KeyError, TypeError)  # what decoding a damaged row raises


class IncidentError(UserError):
    """The incident memory cannot do what was asked (no such incident, a bad file); one line."""


class UnknownIncident(IncidentError):
    """No incident has this fingerprint (an HTTP caller gets 404 for it, not 400)."""


class IncidentUnavailable(IncidentError):
    """The memory's database cannot be used right now (locked, full, damaged, closed)."""


@dataclass(frozen=True, eq=False)
class Embedding:
    """A vector from one model (`space`: vectors of other models do not compare)."""

    space: str
    vector: np.ndarray  # [C] fp32


@dataclass(frozen=True)
class Incident:
    """One incident as the memory keeps it. `first_seen`/`last_seen` are when the pipeline
    saw it (retention counts from them); `starts_at`/`ends_at` its lines' own times."""

    fingerprint: str
    state: str = "firing"  # the group's: pending | firing | resolved
    first_seen: float = 0.0
    last_seen: float = 0.0
    starts_at: float = 0.0
    ends_at: float = 0.0
    group_key: str = ""
    receiver: str = ""
    streams: tuple[str, ...] = ()
    templates: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    severity: str = ""
    count: int = 0
    max_score: float = 0.0
    model_id: str = ""
    model_version: str = ""
    embedding: Embedding | None = None  # the mean of its first lines' embeddings
    embedded: int = 0  # lines averaged into `embedding`
    resolution: str = ""
    resolved_by: str = ""
    resolved_at: float | None = None

    def to_json(self) -> dict[str, object]:
        """Everything but the vector (which says nothing to a reader)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "embedding"}
        out["space"] = self.embedding.space if self.embedding is not None else ""
        return out


def observed(group: Group, *anomalies: Anomaly) -> Incident:
    """What an alert group (and the anomalies just folded into it) says of its incident."""
    streams = [group.labels.get("stream", ""), *(a.stream for a in anomalies)]
    templates = [group.template_text, *(a.template or "" for a in anomalies)]
    return Incident(
        fingerprint=group.dedup_key,
        state=group.state,
        first_seen=group.first_seen,
        last_seen=group.last_seen,
        starts_at=group.event_time or group.first_seen,
        ends_at=group.last_event_time or group.last_seen,
        group_key=group.key,
        receiver=group.receiver,
        streams=tuple(dict.fromkeys(streams)),
        templates=tuple(dict.fromkeys(templates)),
        examples=group.examples or (group.first_line,),
        severity=group.severity,
        count=group.count,
        max_score=group.max_score,
        model_id=group.model_id,
        model_version=group.model_version,
    )


def merged(held: Incident | None, seen: Incident, embedding: Embedding | None = None) -> Incident:
    """`seen` (the group now) over `held` (the stored incident): the streams and templates of
    both (first ones first), the operator's resolution kept, and `embedding` averaged into
    the incident's vector while it holds fewer than MAX_EMBEDDED lines of the same model;
    every field within its bound (`MAX_*`)."""
    seen = replace(
        seen,
        streams=_bounded(seen.streams, MAX_STREAMS),
        templates=_bounded(seen.templates, MAX_TEMPLATES),
        examples=_bounded(seen.examples, MAX_EXAMPLES),
        resolution=seen.resolution[:MAX_RESOLUTION],
    )
    if embedding is not None:
        if embedding.vector.ndim != 1 or not 0 < embedding.vector.size <= MAX_DIMENSIONS:
            raise IncidentError(
                f"embedding: shape {embedding.vector.shape} is not a vector of 1..{MAX_DIMENSIONS}"
            )
        embedding = Embedding(embedding.space, np.asarray(embedding.vector, dtype=np.float32))
    if held is None:
        return replace(seen, embedding=embedding, embedded=int(embedding is not None))
    vector, embedded = held.embedding, held.embedded
    if embedding is not None and embedded < MAX_EMBEDDED:
        if vector is None:
            vector, embedded = embedding, 1
        elif vector.space == embedding.space and vector.vector.shape == embedding.vector.shape:
            mean = (vector.vector * embedded + embedding.vector) / (embedded + 1)
            vector, embedded = Embedding(vector.space, mean.astype(np.float32)), embedded + 1
    return replace(
        seen,
        first_seen=min(held.first_seen, seen.first_seen),
        starts_at=min(held.starts_at, seen.starts_at),
        streams=_bounded((*held.streams, *seen.streams), MAX_STREAMS),
        templates=_bounded((*held.templates, *seen.templates), MAX_TEMPLATES),
        embedding=vector,
        embedded=embedded,
        resolution=held.resolution,
        resolved_by=held.resolved_by,
        resolved_at=held.resolved_at,
    )


def verdicts_on(incident: Incident, feedback: list[Feedback], now: float | None = None) -> list[Feedback]:
    """Of `feedback` (oldest first), what operators said about the incident that is in force
    at `now`: every verdict naming its fingerprint, and the rules that cover it as scoring
    obeys them: a rule whose template covers one of its templates (`feedback.covers`) and
    whose stream glob takes one of its streams, when it is its template and scope's verdict
    in force (the newest not expired). Expired verdicts never come."""
    at = time.time() if now is None else now
    named = f"fingerprint:{incident.fingerprint}"
    in_force = {id(f) for f in effective(feedback, at)}
    return [
        f
        for f in feedback
        if f.in_force(at)
        and (
            f.target == named
            or (
                id(f) in in_force
                and _scoped(f, incident)
                and any(covers(f.template, t) for t in incident.templates)
            )
        )
    ]


def _scoped(feedback: Feedback, incident: Incident) -> bool:
    """Whether a rule's stream glob takes one of the incident's streams."""
    return feedback.stream == EVERY_STREAM or any(
        fnmatch.fnmatchcase(stream, feedback.stream) for stream in incident.streams
    )


def _bounded(texts: tuple[str, ...] | list[str], limit: int) -> tuple[str, ...]:
    """The first `limit` distinct non-empty texts, each cut to MAX_TEXT characters."""
    return tuple(dict.fromkeys(t[:MAX_TEXT] for t in texts if t))[:limit]


def _keep(incident: Incident) -> int:
    if incident.state != "resolved":
        return OPEN
    return RESOLVED if incident.resolution else CLOSED


_DATA_FIELDS = (
    "state", "starts_at", "ends_at", "group_key", "receiver", "streams", "templates", "examples",
    "severity", "count", "max_score", "model_id", "model_version", "embedded",
)  # fmt: skip
_COLUMNS = "fingerprint, first_seen, last_seen, data, space, embedding, resolution, resolved_by, resolved_at"


def _row(incident: Incident) -> tuple[object, ...]:
    data = json.dumps({k: getattr(incident, k) for k in _DATA_FIELDS}, separators=(",", ":"))
    vector = incident.embedding
    return (
        incident.fingerprint, _keep(incident), incident.first_seen, incident.last_seen, data,
        vector.space if vector is not None else "", vector.vector.tobytes() if vector is not None else None,
        incident.resolution, incident.resolved_by, incident.resolved_at,
    )  # fmt: skip


def _incident(row: tuple) -> Incident:
    fingerprint, first_seen, last_seen, data, space, blob, resolution, resolved_by, resolved_at = row
    stored = json.loads(data)
    fields = {k: stored[k] for k in _DATA_FIELDS if k in stored}  # one missing keeps its default
    for name in ("streams", "templates", "examples"):
        fields[name] = tuple(fields.get(name, ()))
    embedding = Embedding(space, np.frombuffer(blob, dtype=np.float32)) if blob else None
    return Incident(
        fingerprint=fingerprint, first_seen=first_seen, last_seen=last_seen, embedding=embedding,
        resolution=resolution, resolved_by=resolved_by, resolved_at=resolved_at, **fields,
    )  # fmt: skip


class IncidentTable:
    """The `incidents` table over a connection, inside the caller's transaction (so the
    pipeline can write an incident in the transaction that stores its group)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def get(self, fingerprint: str) -> Incident | None:
        """The incident, or None (also when its row no longer decodes: the next record of
        its group writes it anew)."""
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM incidents WHERE fingerprint = ?", (fingerprint,)
        ).fetchone()
        try:
            return _incident(row) if row else None
        except _BAD_ROW:
            return None

    def put(self, incident: Incident, max_incidents: int) -> list[str]:
        """Insert or replace an incident; returns the fingerprints evicted to stay within
        `max_incidents` (only a new incident can push one out)."""
        held = self.db.execute(
            "SELECT 1 FROM incidents WHERE fingerprint = ?", (incident.fingerprint,)
        ).fetchone()
        self.db.execute(
            "INSERT INTO incidents (fingerprint, keep, first_seen, last_seen, data, space, embedding,"
            " resolution, resolved_by, resolved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (fingerprint) DO UPDATE SET keep = excluded.keep, first_seen = excluded.first_seen,"
            " last_seen = excluded.last_seen, data = excluded.data, space = excluded.space,"
            " embedding = excluded.embedding, resolution = excluded.resolution,"
            " resolved_by = excluded.resolved_by, resolved_at = excluded.resolved_at",
            _row(incident),
        )
        if held is not None:
            return []
        over = self.db.execute("SELECT COUNT(*) FROM incidents").fetchone()[0] - max_incidents
        if over <= 0:
            return []
        rows = self.db.execute(
            "DELETE FROM incidents WHERE id IN (SELECT id FROM incidents ORDER BY keep, last_seen, id LIMIT ?)"
            " RETURNING fingerprint",
            (over,),
        ).fetchall()
        return [r[0] for r in rows]

    def prune(self, before: float) -> list[str]:
        """Delete incidents last seen before `before`; returns their fingerprints."""
        rows = self.db.execute("DELETE FROM incidents WHERE last_seen < ? RETURNING fingerprint", (before,))
        return [r[0] for r in rows.fetchall()]

    def all(self) -> Iterator[Incident]:
        """Every readable incident, oldest first (a damaged row is skipped)."""
        for row in self.db.execute(f"SELECT {_COLUMNS} FROM incidents ORDER BY first_seen, id"):
            try:
                yield _incident(row)
            except _BAD_ROW:
                continue

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM incidents").fetchone()[0])


@contextmanager
def _sqlite_errors(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise IncidentUnavailable(f"incident memory {path}: {exc}") from exc


class IncidentStore:
    """The incidents of one SQLite file (WAL; the alert outbox's), thread-safe.

    What the pipeline records is committed at `synchronous=NORMAL`: the memory is not what
    delivery depends on, and a power cut may lose the latest updates (never the file's
    consistency), which the next anomaly of a group writes again. A resolution is an
    operator's words, which nothing writes again: durable (FULL) when `resolve` returns.
    Verdicts are read from and written to the feedback database (`feedback_path`; by default
    this same file, as serve's default is; none for an in-memory store, as a replay's dry run
    keeps, unless one is given).
    """

    def __init__(
        self,
        path: str | Path,
        max_incidents: int,
        feedback_path: str | Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.path = str(path)
        self.max_incidents = max_incidents
        self._lock = threading.Lock()
        with _sqlite_errors(self.path):  # the outbox made the file's folder
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=timeout
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(INCIDENTS_SCHEMA)
        self.table = IncidentTable(self._db)
        # reads on a connection and lock of their own: a lookup never queues behind a write
        # that waits for the file's lock (WAL readers do not wait for writers)
        self._read_lock, self._reader = self._lock, self.table
        if self.path != ":memory:":
            with _sqlite_errors(self.path):
                rdb = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=timeout
                )
            self._read_lock, self._reader = threading.Lock(), IncidentTable(rdb)
        if feedback_path is None and self.path == ":memory:":
            self.feedback: FeedbackStore | None = None
        else:
            self.feedback = FeedbackStore(path if feedback_path is None else feedback_path, timeout=timeout)

    @contextmanager
    def _write(self, durable: bool = False) -> Iterator[IncidentTable]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error); `durable`
        commits it at synchronous=FULL."""
        with _sqlite_errors(self.path), self._lock:
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self.table
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def record(self, seen: Incident, embedding: Embedding | None = None) -> tuple[Incident, list[str]]:
        """Fold what a group says now into its incident; (the incident as stored, the
        fingerprints evicted to make room)."""
        with self._write() as table:
            incident = merged(table.get(seen.fingerprint), seen, embedding)
            return incident, table.put(incident, self.max_incidents)

    def resolve(self, fingerprint: str, text: str, by: str = "", now: float | None = None) -> Incident:
        """Set an incident's resolution (the latest one wins); IncidentError if unknown."""
        text = text.strip()
        if not text:
            raise IncidentError("resolution: empty (say what was done)")
        if len(text) > MAX_RESOLUTION:
            raise IncidentError(f"resolution: longer than {MAX_RESOLUTION} characters")
        with self._write(durable=True) as table:
            held = table.get(fingerprint)
            if held is None:
                raise UnknownIncident(f"fingerprint {fingerprint}: no such incident in {self.path}")
            at = time.time() if now is None else now
            incident = replace(held, resolution=text, resolved_by=by[:MAX_TEXT], resolved_at=at)
            table.put(incident, self.max_incidents)
        return incident

    def get(self, fingerprint: str) -> Incident | None:
        with _sqlite_errors(self.path), self._read_lock:
            return self._reader.get(fingerprint)

    def all(self) -> list[Incident]:
        with _sqlite_errors(self.path), self._read_lock:
            return list(self._reader.all())

    def count(self) -> int:
        with _sqlite_errors(self.path), self._read_lock:
            return self._reader.count()

    def prune(self, before: float) -> list[str]:
        """Delete incidents last seen before `before` (now - retention); their fingerprints."""
        with self._write() as table:
            return table.prune(before)

    def embedded(self, fingerprint: str, embedding: Embedding) -> Incident | None:
        """Average a line's embedding into a kept incident's vector (`merged`: while it holds
        fewer than MAX_EMBEDDED lines of one model); the incident as stored, or None when it
        is gone (evicted or pruned since the line was queued)."""
        with self._write() as table:
            held = table.get(fingerprint)
            if held is None:
                return None
            incident = merged(held, held, embedding)
            table.put(incident, self.max_incidents)
            return incident

    def verdicts(self) -> list[Feedback]:
        """Every stored verdict, oldest first (none without a feedback database). Read with
        scoring's short lock wait: an alert never waits on a feedback database that another
        process holds (it goes out without the verdicts, and the error is counted)."""
        return self.feedback.listed(timeout=READ_TIMEOUT_SECONDS) if self.feedback is not None else []

    def verdicts_for(self, incident: Incident, now: float | None = None) -> list[Feedback]:
        """What operators said about an incident, in force at `now`, oldest first (`verdicts_on`)."""
        return verdicts_on(incident, self.verdicts(), now)

    def attach_verdict(self, fingerprint: str, verdict: str, comment: str = "", by: str = "") -> Feedback:
        """A verdict (and why) on an incident, stored as `logstream feedback --fingerprint`
        stores it, so scoring obeys it too; works for incidents whose group the outbox has
        since reused for a newer incident."""
        incident = self.get(fingerprint)
        if incident is None:
            raise UnknownIncident(f"fingerprint {fingerprint}: no such incident in {self.path}")
        if self.feedback is None:
            raise IncidentError(f"incident memory {self.path}: no feedback database to store a verdict in")
        feedback = Feedback(
            verdict, incident.templates[0] if incident.templates else "", f"fingerprint:{fingerprint}",
            incident.examples[0] if incident.examples else "", incident.model_id, by, comment,
        )  # fmt: skip
        check(feedback)
        return self.feedback.add(feedback)

    def close(self) -> None:
        if self.feedback is not None:
            self.feedback.close()
        with self._lock:
            self._db.close()
        if self._reader is not self.table:
            with self._read_lock:
                self._reader.db.close()
