"""An append-only file under a size cap: serve's audit log and its JSONL anomaly sink.

The current file is `PATH`; when the next write would take it past `max_bytes` it becomes
`PATH.1` (the one before moves to `PATH.2`, and so on) and a new `PATH` starts. At most
`files` files are kept, the current one included, so the whole never holds more than
`files x max_bytes` (one write larger than `max_bytes` goes in whole). Readers take the
files oldest first (`rotated_files`). Each write is flushed and fsynced before it returns:
what a source commits after it survives a crash.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from pathlib import Path

MAX_BYTES = 64 * 2**20  # per file: ~280,000 audit lines of ~240 bytes
FILES = 8  # kept, the current one included: 512 MiB in all


class RotatingFile:
    """Appends whole records (bytes ending in a newline) to `path`, rotating at `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, files: int = FILES) -> None:
        if max_bytes <= 0 or files < 1:
            raise ValueError(f"{path}: max_bytes {max_bytes} and files {files} must be positive")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.files = files
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        # a device or a pipe (/dev/stdout) has no size to cap and cannot be renamed away
        self._rotates = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)

    def append(self, data: bytes) -> None:
        """Write `data` (rotating first if it would pass the cap), flush and fsync."""
        size = self._file.tell() if self._rotates else 0
        if size > 0 and size + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def _rotate(self) -> None:
        """PATH.n -> PATH.n+1 ... PATH -> PATH.1; those that would pass `files` are deleted."""
        self._file.close()
        for number, older in sorted(_numbered(self.path), reverse=True):
            if number + 1 < self.files:
                older.replace(self.path.with_name(f"{self.path.name}.{number + 1}"))
            else:
                older.unlink()
        if self.files > 1:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self._file = self.path.open("ab")
        _sync_folder(self.path.parent)  # the renames survive a power cut with the data they name

    def close(self) -> None:
        self._file.close()


def rotated_files(path: Path) -> list[Path]:
    """The files of a rotating file that exist, oldest first: `PATH.n` ... `PATH.1`, `PATH`."""
    return [p for _, p in sorted(_numbered(path), reverse=True)] + ([path] if path.exists() else [])


def _numbered(path: Path) -> list[tuple[int, Path]]:
    """(number, file) of each `PATH.<number>` there is."""
    suffix = re.compile(re.escape(path.name) + r"\.(\d+)")
    return [
        (int(m[1]), p)
        for p in path.parent.glob(f"{glob.escape(path.name)}.*")
        if (m := suffix.fullmatch(p.name))
    ]


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
