"""serve's audit log: a JSON line per scored line, in size-capped files that rotate.

The current file is `PATH`; when the next batch would take it past `max_bytes` it becomes
`PATH.1` (the one before moves to `PATH.2`, and so on) and a new `PATH` starts. At most
`files` files are kept, the current one included, so the log never holds more than
`files x max_bytes` (a single batch larger than `max_bytes` is written whole). Readers take
the files oldest first (`audit_files`): `logstream feedback --at`, `logstream models compare`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logstream.detector import ScoredLine

MAX_BYTES = 64 * 2**20  # per file: ~280,000 lines of ~240 bytes
FILES = 8  # kept, the current one included: 512 MiB in all


class AuditLog:
    """A JSON line per scored line, fsynced per batch: a backtest trail, an at-least-once proof."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, files: int = FILES) -> None:
        if max_bytes <= 0 or files < 1:
            raise ValueError(f"audit log: max_bytes {max_bytes} and files {files} must be positive")
        self.path = path
        self.max_bytes = max_bytes
        self.files = files
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        # a device or a pipe (/dev/stdout) has no size to cap and cannot be renamed away
        self._rotates = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)

    def write(self, scored: Sequence[ScoredLine], model: str = "", shadow: bool = False) -> None:
        at = round(time.time(), 3)  # wall time, for `logstream models compare --since/--until`
        batch = "".join(json.dumps(_entry(line, at, model, shadow)) + "\n" for line in scored).encode()
        if self._rotates and self._file.tell() > 0 and self._file.tell() + len(batch) > self.max_bytes:
            self._rotate()
        self._file.write(batch)
        self._file.flush()
        os.fsync(self._file.fileno())

    def _rotate(self) -> None:
        """PATH.n -> PATH.n+1 ... PATH -> PATH.1; those that would pass `files` are deleted."""
        self._file.close()
        for number, older in sorted(_rotated(self.path), reverse=True):
            if number + 1 < self.files:
                older.replace(_numbered(self.path, number + 1))
            else:
                older.unlink()
        if self.files > 1:
            self.path.replace(_numbered(self.path, 1))
        else:
            self.path.unlink()
        self._file = self.path.open("ab")
        _sync_folder(self.path.parent)  # the renames survive a power cut with the data they name

    def close(self) -> None:
        self._file.close()


def audit_files(path: Path) -> list[Path]:
    """The audit log's files that exist, oldest first: `PATH.n` ... `PATH.1`, then `PATH`."""
    return [p for _, p in sorted(_rotated(path), reverse=True)] + ([path] if path.exists() else [])


def _rotated(path: Path) -> list[tuple[int, Path]]:
    """(number, file) of each `PATH.<number>` there is."""
    suffix = re.compile(re.escape(path.name) + r"\.(\d+)")
    return [
        (int(m[1]), p)
        for p in path.parent.glob(f"{glob.escape(path.name)}.*")
        if (m := suffix.fullmatch(p.name))
    ]


def _numbered(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entry(line: ScoredLine, at: float, model: str, shadow: bool) -> dict[str, object]:
    entry: dict[str, object] = {
        "at": at,
        "source": line.record.source,
        "offset": line.record.offset,
        "stream": line.record.stream,
        "kind": line.kind,
        "score": round(line.score, 4),  # -log10 p, the one unit
        "surprisal": round(line.surprisal, 4),  # nats, the model alone
        "anomaly": line.is_anomaly,
        "template": line.template,  # what `logstream feedback --at topic/partition@offset` marks
        "model": model,  # the version that scored it (`logstream models compare`)
    }
    if line.crash:
        entry["crash"] = True  # unseen, and its words name a crash: the score holds +1.3
    if line.follows:
        entry["follows"] = True  # unseen, right after its source's alert: the score is that alert's
    if line.suppressed:
        entry["suppressed"] = True  # over the threshold, but its template was marked normal
    if shadow:
        entry["shadow"] = True  # a candidate's score: it never reached the sink
    return entry
