"""The model store: a directory of immutable, numbered model versions with lineage, and which
one is live.

    STORE/versions/v0001/        an ordinary model directory (read-only files) + lineage.json
    STORE/versions/v0002/
    STORE/live.jsonl             append-only: every promote and rollback, who, when, why

A version is added once (`add`: copied to a temporary name, then renamed, so a reader never
sees half of one) and never changed: its files are made read-only and nothing here writes
into it again. Its `lineage.json` says where it came from: the parent version (the model it
continued from), the training data's hash, window and counts, the training config, the
calibration, the feedback it learned, and an evaluation when one was run.

The live version is the last line of `live.jsonl`. The lines replay as a stack: a promote
pushes a version, a rollback pops the top, so the live version is the top and a rollback
returns to the version promoted before it; repeated rollbacks walk back through the
promotions (`rollback_path`), never to and fro. Appends of one short line are atomic
(O_APPEND), so two operators cannot tear the file; a line torn by a crash or a full disk is
skipped when read, and the next append starts on a line of its own, so it is never lost
to the torn one. serve polls the file to hot-reload (`model.store` in the serve
settings). The store may be a local path or a mounted volume.

`lineage.json` records the version's content hash (`content_sha256`: weights, tokenizer,
config.json, logstream.json); `verify` checks the files against it before a promote and
before serve loads the version, so a version whose files changed is refused by name.

The version's name is its directory name, so `Detector.model_id` (`v0003@<content hash>`)
and with it every alert and audit line carry it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstream.engine.metadata import VERSIONS, content_sha256
from logstream.errors import UserError

LIVE = "live.jsonl"
LINEAGE = "lineage.json"
_VERSION = re.compile(r"v(\d{4,})")
ACTIONS = ("promote", "rollback")
# logstream.json keys that lineage.json repeats, so `models show` needs no model loading
LINEAGE_KEYS = (
    "data_sha256", "data_window", "train_lines", "heldout_lines", "train_tokens", "train_steps",
    "final_loss", "train_config", "preset", "window", "created_at", "feedback_lines", "replayed_lines",
    "new_lines", "prompt_refreshed",
)  # fmt: skip


class StoreError(UserError):
    """A model store or version that cannot be used; one line naming it and the reason."""


@dataclass(frozen=True)
class LiveEntry:
    version: str
    previous: str | None
    action: str  # "promote" | "rollback"
    at: float
    by: str = ""
    comment: str = ""


def versions(store: Path) -> list[str]:
    """The store's versions, oldest first."""
    root = store / VERSIONS
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir() if _VERSION.fullmatch(p.name)), key=lambda n: int(n[1:]))


def version_dir(store: Path, version: str) -> Path:
    """The directory of a version; StoreError if the store has no such version."""
    if not isinstance(version, str):
        raise StoreError(
            f"model store {store}: a version is a name like 'v0001', not {type(version).__name__} {version!r}"
        )
    path = store / VERSIONS / version
    if not _VERSION.fullmatch(version) or not (path / LINEAGE).is_file():
        known = ", ".join(versions(store)) or "none"
        raise StoreError(f"model store {store}: no version {version!r} (versions: {known})")
    return path


def lineage(store: Path, version: str) -> dict[str, Any]:
    path = version_dir(store, version) / LINEAGE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: expected a JSON object")
    return data


def add(
    store: Path,
    model_dir: Path,
    *,
    evaluation: dict[str, Any] | None = None,
    by: str = "",
    comment: str = "",
) -> str:
    """Copy a trained model directory into the store as the next version; its name.

    The parent is the version the model continued from (`logstream train --from` records
    it in logstream.json as `parent`, the parent's model id)."""
    meta_path = model_dir / "logstream.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{model_dir}: not a model directory ({meta_path}: {exc})") from None
    root = store / VERSIONS
    root.mkdir(parents=True, exist_ok=True)
    existing = versions(store)
    number = int(existing[-1][1:]) + 1 if existing else 1
    name = f"v{number:04d}"
    calibration = meta.get("calibration", {})
    record = {
        "version": name,
        "parent": meta.get("parent"),
        "source": str(model_dir),
        "added_at": time.time(),
        "added_by": by,
        "comment": comment,
        "calibration": {
            "false_alarm_rate": calibration.get("config", {}).get("false_alarm_rate"),
            "heldout_lines": calibration.get("heldout_lines"),
        },
        "evaluation": evaluation,
        **{k: meta[k] for k in LINEAGE_KEYS if k in meta},
    }
    staging = root / f".{name}.{os.getpid()}.tmp"
    try:
        shutil.copytree(model_dir, staging)
        record["content_sha256"] = content_sha256(staging)  # of the copy: what the store holds
        (staging / LINEAGE).write_text(json.dumps(record, indent=2), encoding="utf-8")
        for path in staging.iterdir():
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # immutable: read-only files
        staging.rename(root / name)  # fails if another `add` took this number: nothing half-made
    except (OSError, UserError) as exc:  # UserError: a file of the copy that cannot be read
        shutil.rmtree(staging, ignore_errors=True)
        raise StoreError(f"model store {store}: cannot add {model_dir}: {exc}") from None
    return name


def verify(store: Path, version: str) -> None:
    """StoreError if the version's files no longer hash to the content hash recorded when it
    was added (a version added without one has nothing to check)."""
    expected = lineage(store, version).get("content_sha256")
    if expected is None:
        return
    found = content_sha256(version_dir(store, version))
    if found != expected:
        raise StoreError(
            f"model store {store}: {version}'s files changed since it was added "
            f"(content hash {found[:12]}, recorded {str(expected)[:12]})"
        )


def history(store: Path) -> list[LiveEntry]:
    """Every promote and rollback, oldest first (a torn or foreign line is skipped)."""
    path = store / LIVE
    if not path.is_file():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace")  # a torn multi-byte character
    return [entry for line in text.splitlines() if (entry := _entry(line)) is not None]


def _entry(line: str) -> LiveEntry | None:
    """A history line as `_append` writes it, or None (torn, foreign, or not a version)."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    version, previous, action = data.get("version"), data.get("previous"), data.get("action")
    at, by, comment = data.get("at"), data.get("by", ""), data.get("comment", "")
    if not (isinstance(version, str) and _VERSION.fullmatch(version) and action in ACTIONS):
        return None
    if previous is not None and not (isinstance(previous, str) and _VERSION.fullmatch(previous)):
        return None
    if not (isinstance(at, int | float) and isinstance(by, str) and isinstance(comment, str)):
        return None
    return LiveEntry(version, previous, action, float(at), by, comment)


def rollback_path(store: Path) -> list[str]:
    """The live version, then the version a rollback makes live, then the one a second
    rollback does, and so on: the history replayed as a stack, top first."""
    stack: list[str] = []
    for entry in history(store):
        if entry.action == "rollback" and stack:
            stack.pop()
        if not stack or stack[-1] != entry.version:
            stack.append(entry.version)
    return stack[::-1]


def live(store: Path) -> str | None:
    """The live version, or None before the first promote."""
    entries = history(store)
    return entries[-1].version if entries else None


def live_dir(store: Path) -> Path:
    """The live version's directory; StoreError when nothing was promoted yet."""
    version = live(store)
    if version is None:
        raise StoreError(f"model store {store}: nothing promoted yet (logstream models promote)")
    return version_dir(store, version)


def promote(store: Path, version: str, *, by: str = "", comment: str = "") -> LiveEntry:
    """Make `version` live (its files checked against its content hash); a rollback returns
    to the version live before it."""
    verify(store, version)
    current = live(store)
    if current == version:
        raise StoreError(f"{version} is already live")
    return _append(store, LiveEntry(version, current, "promote", time.time(), by, comment))


def rollback(store: Path, *, by: str = "", comment: str = "") -> LiveEntry:
    """Go back to the version promoted before the current one; a second rollback goes back
    one more."""
    path = rollback_path(store)
    if len(path) < 2:
        raise StoreError(f"model store {store}: no earlier live version to roll back to")
    target, below = path[1], path[2] if len(path) > 2 else None
    return _append(store, LiveEntry(target, below, "rollback", time.time(), by, comment))


def _append(store: Path, entry: LiveEntry) -> LiveEntry:
    store.mkdir(parents=True, exist_ok=True)
    line = json.dumps(vars(entry)) + "\n"
    fd = os.open(store / LIVE, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # the last line was torn: end it, or this one would join it
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry
