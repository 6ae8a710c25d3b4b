"""File and stdin sources: replay, follow mode (appends, rotation), bad lines skipped."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from logstream.consumers.file import read_file
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.settings import InputSettings

PARSER = RecordParser(InputSettings(stream_key="regex", stream_regex=r"host=(\w+)"))


def test_replay_yields_lines_with_line_numbers_and_skips_bad(tmp_path: Path) -> None:
    """A file replays in order with its line numbers; bad lines are counted, not yielded."""
    path = tmp_path / "app.log"
    path.write_bytes(b"a host=h1\n\xff\xfe\n\nb host=h2\n")
    rejects = RejectLog()
    records = list(read_file(path, PARSER, rejects))
    assert [(r.line, r.stream, r.offset) for r in records] == [
        ("a host=h1", "h1", 0),
        ("b host=h2", "h2", 3),
    ]
    assert all(r.source == str(path) for r in records)
    assert rejects.counts["undecodable"] == 1
    assert rejects.counts["empty"] == 1


def test_follow_sees_appends_and_rotation(tmp_path: Path) -> None:
    """Follow mode yields appended lines, waits for a half-written line, and follows a rotation."""
    path = tmp_path / "app.log"
    path.write_text("one\n")
    stop = threading.Event()
    lines = read_file(path, PARSER, RejectLog(), follow=True, poll_seconds=0.02, stop=stop)
    assert next(lines).line == "one"
    with path.open("a") as handle:
        handle.write("tw")
        handle.flush()
        handle.write("o\n")
    assert next(lines).line == "two"
    path.rename(tmp_path / "app.log.1")
    path.write_text("three\n")
    assert next(lines).line == "three"
    stop.set()
    assert list(lines) == []


def test_stdin_source_reads_until_eof() -> None:
    """read_stdin yields each input line and ends when stdin closes."""
    code = (
        "from logstream.consumers.stdin import read_stdin\n"
        "from logstream.consumers.parse import RecordParser, RejectLog\n"
        "from logstream.settings import InputSettings\n"
        "for r in read_stdin(RecordParser(InputSettings()), RejectLog()):\n"
        "    print(r.offset, r.line)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=b"x\ny\n", capture_output=True, timeout=60, check=True
    )
    assert result.stdout.decode().splitlines() == ["0 x", "1 y"]
