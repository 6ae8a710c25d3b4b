"""Shared pieces of the feedback tests: another process holding the database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Holds the database until a line arrives on stdin: exclusive locking mode keeps even
# readers out (a WAL database lets readers past a mere BEGIN EXCLUSIVE).
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("SELECT COUNT(*) FROM feedback").fetchone()
print("locked", flush=True)
sys.stdin.readline()
"""


@contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holds the database exclusively for the duration."""
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        yield
    finally:
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.close()
        locker.wait(timeout=60)
