"""Stdin source: one log line per input line, judged like any other source's messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from logstream.consumers.file import parse_lines
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.records import LogRecord


def read_stdin(parser: RecordParser, rejects: RejectLog) -> Iterator[LogRecord]:
    """Yield records from standard input until it closes; bad lines are counted and skipped."""
    yield from parse_lines(iter(sys.stdin.buffer), "stdin", parser, rejects)
