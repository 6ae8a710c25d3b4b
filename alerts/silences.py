"""Silences: label globs plus an expiry, from the routes file or a silences file.

The silences file is plain YAML (a list of silences) so that on-call can edit
it by hand or with `add_silence` (the CLI's `silence` command). A running
pipeline re-reads it when its modification time changes, so a silence added
during an incident takes effect at the next evaluation without a restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

import structlog
import yaml
from pydantic import ValidationError

from logstream.alerts.config import AlertConfigError, Silence, describe, load_config

log = structlog.get_logger(__name__)


def matches(globs: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True when every label glob matches (a missing label matches only '*' or '')."""
    return all(fnmatchcase(labels.get(name, ""), glob) for name, glob in globs.items())


def silenced_by(silences: Sequence[Silence], labels: Mapping[str, str], now: float) -> Silence | None:
    """The first active silence that mutes these labels, if any."""
    for silence in silences:
        if silence.starts_at <= now < silence.expires_at and matches(silence.matchers, labels):
            return silence
    return None


def load_silences(path: str | Path) -> list[Silence]:
    """Read a silences file; a missing file is no silences, a bad one is an AlertConfigError."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except (OSError, yaml.YAMLError) as exc:
        raise AlertConfigError(f"{path}: cannot read silences: {exc}") from None
    if not isinstance(data, list):
        raise AlertConfigError(f"{path}: expected a list of silences")
    out = []
    for i, item in enumerate(data):
        try:
            out.append(Silence.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            reason = first["msg"].removeprefix("Value error, ")
            raise AlertConfigError(f"{path}: [{i}]{'.' + where if where else ''}: {reason}") from None
    return out


def add_silence(path: str | Path, silence: Silence) -> list[Silence]:
    """Append a silence to the file (written atomically); returns the file's silences."""
    path = Path(path)
    silences = [*load_silences(path), silence]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump([s.model_dump() for s in silences], sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
    return silences


def parse_matchers(pairs: Sequence[str]) -> dict[str, str]:
    """['stream=hdfs-*', 'severity=critical'] -> {'stream': 'hdfs-*', ...}."""
    out = {}
    for pair in pairs:
        name, sep, glob = pair.partition("=")
        if not sep or not name:
            raise AlertConfigError(f"--match {pair!r}: expected LABEL=GLOB")
        out[name.strip()] = glob.strip()
    return out


def silence_for(
    routes: str | Path, matchers: dict[str, str], duration: float, comment: str, created_by: str
) -> Silence:
    """Add a silence to the routes file's `silences_file`; returns it."""
    config = load_config(routes)
    if not config.silences_file:
        raise AlertConfigError(f"{routes}: silences_file is not set; the CLI writes silences there")
    now = time.time()
    try:
        silence = Silence(
            matchers=matchers, starts_at=now, expires_at=now + duration,
            created_by=created_by, comment=comment,
        )  # fmt: skip
    except ValidationError as exc:
        raise AlertConfigError(f"silence: {describe(exc)}") from None
    add_silence(config.silences_file, silence)
    return silence


class SilenceSet:
    """The routes file's silences plus a silences file, re-read when the file changes."""

    def __init__(self, inline: Sequence[Silence], path: str | Path | None) -> None:
        self._inline = list(inline)
        self._path = Path(path) if path else None
        self._mtime: float | None = None
        self._from_file: list[Silence] = []

    def current(self) -> list[Silence]:
        if self._path is not None:
            mtime = self._path.stat().st_mtime if self._path.exists() else None
            if mtime != self._mtime:
                self._mtime = mtime
                try:
                    self._from_file = load_silences(self._path)
                except AlertConfigError as exc:  # keep the last good set; say so once per edit
                    log.warning("silences_file_invalid", error=str(exc))
        return [*self._inline, *self._from_file]
