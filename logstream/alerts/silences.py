"""Silences: matchers plus a time window, kept in the outbox database.

`logstream alerts silence add|list|expire` writes the `silences` table of the
routes file's outbox (SQLite, the same file the delivery worker uses), so a
silence survives restarts and a running pipeline sees it at its next
evaluation without re-reading any file. Silences written in the routes file
(`silences:`) apply too; they are part of the config and cannot be expired
from the CLI.

Older releases appended CLI silences to a YAML `silences_file`. If the routes
file still names one, its silences are imported into the table when the
outbox opens and whenever the file changes (by content: importing twice adds
nothing, and a silence expired in the table stays expired).

Like the outbox, the table is per replica: a silence added in one pod does not
mute another pod's alerts. For fleet-wide silences, route to an Alertmanager
(`alertmanager_configs`) and silence there.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml
from pydantic import ValidationError

from logstream.alerts.config import AlertConfigError, AlertsConfig, Silence, describe
from logstream.alerts.matchers import Matcher, matches, parse_matcher

log = structlog.get_logger(__name__)

SILENCES_SCHEMA = """
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    matchers TEXT NOT NULL,
    starts_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS silences_active ON silences (expires_at);
"""


def silenced_by(silences: Sequence[Silence], labels: Mapping[str, str], now: float) -> Silence | None:
    """The first active silence that mutes these labels, if any."""
    for silence in silences:
        if silence.starts_at <= now < silence.expires_at and matches(silence.matchers, labels):
            return silence
    return None


def make_silence(
    config: AlertsConfig,
    matchers: Sequence[str],
    *,
    starts_at: float,
    expires_at: float,
    created_by: str = "",
    comment: str = "",
) -> Silence:
    """A new silence (with a fresh id) whose matchers may use the config's labels."""
    data = {
        "matchers": list(matchers), "starts_at": starts_at, "expires_at": expires_at,
        "created_by": created_by, "comment": comment, "id": uuid.uuid4().hex[:12],
    }  # fmt: skip
    try:
        return Silence.model_validate(data, context={"labels": config.label_names})
    except ValidationError as exc:
        raise AlertConfigError(f"silence: {describe(exc)}") from None


def parse_matcher_args(args: Sequence[str]) -> list[str]:
    """Check `--match` arguments (`team="db"`, `stream=~"prod-.*"`); they are stored as given.

    An unquoted `=` value with `*` or `?` is refused: older releases read `stream=prod-*`
    as a glob, and silently matching nothing would leave on-call paged."""
    for arg in args:
        try:
            matcher = parse_matcher(arg)
        except ValueError as exc:
            raise AlertConfigError(f"--match: {exc}") from None
        bare = not arg.split(matcher.op, 1)[1].strip().startswith('"')
        if matcher.op in ("=", "!=") and bare and any(c in matcher.value for c in "*?"):
            raise AlertConfigError(
                f"--match {arg!r}: `=` compares exactly; for a pattern use =~ with a regex "
                f'(e.g. {matcher.name}=~"{matcher.value.replace("*", ".*").replace("?", ".")}"), '
                "or quote the value to mean it literally"
            )
    return list(args)


class SilenceTable:
    """The outbox's `silences` table on one connection (the caller holds the outbox lock)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def add(self, silence: Silence, now: float, *, replace: bool = True) -> None:
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        self.db.execute(
            f"{verb} INTO silences (id, matchers, starts_at, expires_at, created_by, comment,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (silence.id, _dump_matchers(silence.matchers), silence.starts_at, silence.expires_at,
             silence.created_by, silence.comment, now),
        )  # fmt: skip

    def active(self, now: float) -> list[Silence]:
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM silences WHERE expires_at > ? AND starts_at <= ? ORDER BY created_at",
            (now, now),
        ).fetchall()
        return _decode(rows)

    def listed(self, now: float, *, expired: bool = False) -> list[Silence]:
        """Active and pending silences (and expired ones with `expired`), oldest first."""
        where = "" if expired else "WHERE expires_at > ?"
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM silences {where} ORDER BY created_at, id", () if expired else (now,)
        ).fetchall()
        return _decode(rows)

    def expire(self, silence_id: str, now: float) -> bool:
        """End a silence now; False when no silence with this id is still in effect."""
        cursor = self.db.execute(
            "UPDATE silences SET expires_at = ? WHERE id = ? AND expires_at > ?", (now, silence_id, now)
        )
        return cursor.rowcount > 0


_COLUMNS = "id, matchers, starts_at, expires_at, created_by, comment"


def _dump_matchers(matchers: Sequence[Matcher]) -> str:
    return json.dumps([[m.name, m.op, m.value] for m in matchers])


def _decode(rows: list[Any]) -> list[Silence]:
    """Rows -> silences; a row that does not decode is logged and skipped (never fatal)."""
    out = []
    for id_, raw, starts_at, expires_at, created_by, comment in rows:
        try:
            matchers = tuple(Matcher(str(n), str(o), str(v)) for n, o, v in json.loads(raw))
            out.append(
                Silence.model_construct(
                    matchers=matchers,
                    starts_at=starts_at,
                    expires_at=expires_at,
                    created_by=created_by,
                    comment=comment,
                    id=id_,
                )
            )
        except (ValueError, TypeError) as exc:
            log.error("silence_row_unreadable", silence=id_, error=type(exc).__name__)
    return out


def load_silences_file(path: str | Path, labels: Sequence[str] | None = None) -> list[Silence]:
    """Read an older release's silences file (a YAML list); each gets an id from its content,
    so importing it again adds nothing. Missing: none; unreadable: AlertConfigError."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except (OSError, yaml.YAMLError) as exc:
        raise AlertConfigError(f"{path}: cannot read silences: {exc}".replace("\n", " ")) from None
    if not isinstance(data, list):
        raise AlertConfigError(f"{path}: expected a list of silences")
    out = []
    for i, item in enumerate(data):
        try:
            silence = Silence.model_validate(item, context={"labels": labels} if labels else None)
        except ValidationError as exc:
            raise AlertConfigError(f"{path}: [{i}]: {describe(exc)}") from None
        digest = hashlib.sha256(json.dumps(item, sort_keys=True, default=str).encode()).hexdigest()[:12]
        out.append(silence.model_copy(update={"id": silence.id or f"file-{digest}"}))
    return out


class LegacyFile:
    """Imports an older release's silences file into the table when its mtime changes."""

    def __init__(self, path: str | Path | None, labels: Sequence[str]) -> None:
        self.path = Path(path) if path else None
        self.labels = labels
        self._mtime: float | None = None

    def changed(self) -> list[Silence]:
        """The file's silences if it changed since the last call, else []. An invalid edit is
        logged (once per edit) and imports nothing."""
        if self.path is None:
            return []
        mtime = self.path.stat().st_mtime if self.path.exists() else None
        if mtime is None or mtime == self._mtime:
            return []
        self._mtime = mtime
        try:
            return load_silences_file(self.path, self.labels)
        except AlertConfigError as exc:
            log.warning("silences_file_invalid", error=str(exc))
            return []
