"""File source: replay a log file line by line, or follow it as it grows (`tail -F`).

Lines are read as bytes and judged by the RecordParser like Kafka messages, so
a bad line is counted and skipped, never fatal. A record's `source` is the
path and its `offset` the 0-based line number in the file now at that path
(following, it restarts at 0 after a rotation or truncation, so `path:line`
points at the line). Memory per line is bounded: a line longer than
`max_message_bytes` is read on to its end but only its first
`max_message_bytes + 1` bytes are kept, enough for the parser to reject it as
oversized (a multi-gigabyte line without a newline must not be buffered).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from logstream.consumers.parse import RecordParser, Rejected, RejectLog
from logstream.records import LogRecord


def bounded_lines(handle: BinaryIO, limit: int) -> Iterator[bytes]:
    """The handle's lines (newline kept), each cut to at most `limit + 1` bytes."""
    while chunk := handle.readline(limit + 1):
        line = chunk
        while not chunk.endswith(b"\n") and (chunk := handle.readline(limit + 1)):
            pass  # the rest of an overlong line: read and dropped (the line is oversized anyway)
        yield line


def parse_lines(
    raw_lines: Iterable[bytes], source: str, parser: RecordParser, rejects: RejectLog, kind: str = "file"
) -> Iterator[LogRecord]:
    """Parse raw lines (with or without their newline); count and skip the bad ones."""
    return parse_numbered(enumerate(raw_lines), source, parser, rejects, kind)


def parse_numbered(
    numbered: Iterable[tuple[int, bytes]],
    source: str,
    parser: RecordParser,
    rejects: RejectLog,
    kind: str = "file",
) -> Iterator[LogRecord]:
    """`parse_lines` over (0-based line number in its file, raw line) pairs."""
    for number, raw in numbered:
        parsed = parser.parse(raw.rstrip(b"\r\n"), source=source, offset=number, source_kind=kind)
        if isinstance(parsed, Rejected):
            rejects.add(parsed, source=source, offset=number)
        else:
            yield parsed


def read_file(
    path: Path,
    parser: RecordParser,
    rejects: RejectLog,
    *,
    follow: bool = False,
    from_end: bool = False,
    poll_seconds: float = 0.25,
    stop: threading.Event | None = None,
) -> Iterator[LogRecord]:
    """Yield the file's records; with `follow`, keep waiting for new lines until `stop` is set.

    Follow mode yields only complete lines (a half-written last line waits for
    its newline) and reopens the file when it is rotated (new inode) or
    truncated, reading the new file from its start. With `from_end` it starts at
    the end of the file as it is now (`tail -F`): only lines written from then on,
    numbered as the file's lines (its lines so far are counted once).
    """
    path = Path(path)
    limit = parser.settings.max_message_bytes
    if not follow:
        with path.open("rb") as handle:
            yield from parse_lines(bounded_lines(handle, limit), str(path), parser, rejects)
        return
    stop = stop or threading.Event()
    lines = _follow(path, poll_seconds, stop, limit, from_end)
    yield from parse_numbered(lines, str(path), parser, rejects)


def _follow(
    path: Path, poll_seconds: float, stop: threading.Event, limit: int, from_end: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(line number in the file now open, complete line); numbering restarts with each new file."""
    handle: BinaryIO = path.open("rb")
    pending = b""
    number = 0
    if from_end:
        number, pending = _skip_to_end(handle, limit)
    try:
        while not stop.is_set():
            chunk = handle.readline(limit + 1)
            if chunk:
                if len(pending) <= limit:  # past that the line is oversized: only its end matters
                    pending += chunk
                if chunk.endswith(b"\n"):
                    yield number, pending
                    pending, number = b"", number + 1
                continue
            if _replaced(path, handle):
                handle.close()
                handle, pending, number = path.open("rb"), b"", 0
                continue
            stop.wait(poll_seconds)
    finally:
        handle.close()


def _skip_to_end(handle: BinaryIO, limit: int) -> tuple[int, bytes]:
    """Read an open file to its end: its complete lines (counted) and the start of a line not
    yet ended (at most `limit + 1` bytes, as `_follow` keeps of a line)."""
    number, tail = 0, b""
    while chunk := handle.read(1 << 20):
        number += chunk.count(b"\n")
        end = chunk.rfind(b"\n")
        tail = chunk[end + 1 :] if end >= 0 else tail + chunk
        tail = tail[: limit + 1]
    return number, tail


def _replaced(path: Path, handle: BinaryIO) -> bool:
    """True when `path` now names another file (rotation) or was truncated below our position."""
    try:
        current = path.stat()
    except FileNotFoundError:
        return False  # rotated away and not yet recreated: keep waiting
    opened = os.fstat(handle.fileno())
    return current.st_ino != opened.st_ino or current.st_size < handle.tell()
