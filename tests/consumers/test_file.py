"""File and stdin sources: replay, follow mode (appends, rotation), bad lines skipped."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from logstream.consumers.file import bounded_lines, read_file
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


JSON_PARSER = RecordParser(InputSettings(format="json", max_message_bytes=8192))
HOSTILE = (
    b"[" * 2000 + b"]" * 2000 + b"\n"  # nested past the recursion limit
    + b'{"message": "x", "n": ' + b"9" * 5000 + b"}\n"  # past the int digits limit
    + b'{"message": "ok \\ud800"}\n'  # a lone surrogate
    + b"{" * 10_000 + b"\n"  # overlong and bad
)  # fmt: skip


def test_hostile_file_lines_are_rejects_never_exceptions(tmp_path: Path) -> None:
    """A file of hostile JSON lines replays to its good lines; the rest are counted rejects."""
    path = tmp_path / "app.jsonl"
    path.write_bytes(HOSTILE + b'{"message": "last"}\n')
    rejects = RejectLog()
    records = list(read_file(path, JSON_PARSER, rejects))
    assert [(r.line, r.offset) for r in records] == [("ok ?", 2), ("last", 4)]
    assert rejects.counts["bad_json"] == 2
    assert rejects.counts["oversized"] == 1


def test_overlong_line_is_cut_before_it_is_buffered(tmp_path: Path) -> None:
    """A 5 MB line (limit 64 bytes) reaches the parser cut to 65 bytes: oversized, then the next line."""
    path = tmp_path / "app.log"
    path.write_bytes(b"x" * 5_000_000 + b"\nafter\n")
    with path.open("rb") as handle:
        lines = list(bounded_lines(handle, 64))
    assert [len(line) for line in lines] == [65, 6]
    rejects = RejectLog()
    parser = RecordParser(InputSettings(max_message_bytes=64))
    assert [r.line for r in read_file(path, parser, rejects)] == ["after"]
    assert rejects.counts["oversized"] == 1


def test_follow_mode_rejects_an_overlong_line_and_goes_on(tmp_path: Path) -> None:
    """In follow mode an overlong line is rejected as oversized and the next line still comes."""
    path = tmp_path / "app.log"
    path.write_bytes(b"y" * 10_000 + b"\nnext\n")
    stop = threading.Event()
    rejects = RejectLog()
    parser = RecordParser(InputSettings(max_message_bytes=64))
    lines = read_file(path, parser, rejects, follow=True, poll_seconds=0.02, stop=stop)
    assert next(lines).line == "next"
    stop.set()
    assert rejects.counts["oversized"] == 1


def test_stdin_source_survives_hostile_input() -> None:
    """read_stdin over hostile JSON lines exits 0 and yields only the good line."""
    code = (
        "from logstream.consumers.stdin import read_stdin\n"
        "from logstream.consumers.parse import RecordParser, RejectLog\n"
        "from logstream.settings import InputSettings\n"
        "for r in read_stdin(RecordParser(InputSettings(format='json', max_message_bytes=8192)), RejectLog()):\n"
        "    print('record', r.offset, r.line)\n"  # structlog's default output goes to stdout too
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=HOSTILE + b'{"message": "fine"}\n',
        capture_output=True,
        timeout=60,
        check=True,
    )
    printed = [line for line in result.stdout.decode().splitlines() if line.startswith("record ")]
    assert printed == ["record 2 ok ?", "record 4 fine"]
