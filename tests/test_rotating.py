"""serve's rotating files on disk (logstream/rotating.py): the audit log and the JSONL sink
stay under their caps, and readers of the audit log see every kept file in order."""

from __future__ import annotations

import json
from pathlib import Path

from alerts_support import anomaly

from logstream.alerts.sink import JsonlSink
from logstream.audit import AuditLog
from logstream.detector import ScoredLine
from logstream.lifecycle.feedback import audit_entries
from logstream.records import LogRecord
from logstream.rotating import rotated_files

LINE = "2026-11-02T09:00:00.000Z web-1 INFO sshd[812]: Accepted publickey for deploy from 10.0.0.7"


def batch(first_offset: int, size: int) -> list[ScoredLine]:
    """`size` scored lines of partition logs/0 at consecutive offsets."""
    return [
        ScoredLine(
            record=LogRecord(LINE, "web-1", "logs/0", first_offset + i, source_kind="kafka"),
            score=1.5,
            surprisal=2.0,
            threshold=4.0,
            template="<TS> web-1 INFO <*>",
        )
        for i in range(size)
    ]


def write_batches(audit: AuditLog, batches: int, size: int) -> None:
    for n in range(batches):
        audit.write(batch(n * size, size), model="m@1")
    audit.close()


def test_rotation_keeps_the_audit_log_under_its_cap(tmp_path: Path) -> None:
    """Batch after batch into a real file: never more than `files` files of at most
    `max_bytes` each, however much was written."""
    path = tmp_path / "audit.jsonl"
    write_batches(AuditLog(path, max_bytes=4096, files=3), batches=200, size=5)
    files = rotated_files(path)
    assert [f.name for f in files] == ["audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"]
    assert max(f.stat().st_size for f in files) <= 4096
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) <= 3 * 4096


def test_readers_take_the_rotated_files_oldest_first(tmp_path: Path) -> None:
    """`audit_entries` (feedback --at, models compare) reads the kept files in write order:
    the offsets it yields are the last ones written, consecutive, none twice."""
    path = tmp_path / "audit.jsonl"
    write_batches(AuditLog(path, max_bytes=4096, files=3), batches=200, size=5)
    offsets = [entry["offset"] for entry in audit_entries(path)]
    assert offsets == list(range(1000 - len(offsets), 1000))
    assert len(offsets) > 4096 // len(json.dumps({"line": LINE}))  # more than the current file holds


def test_fewer_files_kept_deletes_the_surplus_at_the_next_rotation(tmp_path: Path) -> None:
    """Restarted with a smaller `files`, the audit log drops the numbered files past it the
    first time it rotates, so the cap holds for the new setting."""
    path = tmp_path / "audit.jsonl"
    write_batches(AuditLog(path, max_bytes=2048, files=6), batches=60, size=5)
    write_batches(AuditLog(path, max_bytes=2048, files=2), batches=10, size=5)
    assert [f.name for f in rotated_files(path)] == ["audit.jsonl.1", "audit.jsonl"]


def test_jsonl_sink_rotates_under_its_cap(tmp_path: Path) -> None:
    """The JSONL anomaly sink rotates like the audit log: `files` files at most, each within
    `max_bytes`, the newest anomalies in the current file."""
    path = tmp_path / "anomalies.jsonl"
    sink = JsonlSink(path, max_bytes=8192, files=2)
    for n in range(100):
        sink.put([anomaly(line=f"ERROR disk /dev/sda1 failed ({n})")])
    sink.close()
    files = rotated_files(path)
    assert [f.name for f in files] == ["anomalies.jsonl.1", "anomalies.jsonl"]
    assert max(f.stat().st_size for f in files) <= 8192
    assert json.loads(path.read_text().splitlines()[-1])["line"].endswith("(99)")
