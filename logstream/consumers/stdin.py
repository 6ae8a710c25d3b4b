"""Stdin source: one log line per input line, judged like any other source's messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from logstream.consumers.file import bounded_lines, parse_lines
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.records import LogRecord


def read_stdin(parser: RecordParser, rejects: RejectLog) -> Iterator[LogRecord]:
    """Yield records from standard input until it closes; bad lines are counted and skipped.

    Never raises on what it reads: lines are cut like a file's (`bounded_lines`) and judged by
    the parser, which turns any bad input into a counted reject.
    """
    lines = bounded_lines(sys.stdin.buffer, parser.settings.max_message_bytes)
    yield from parse_lines(lines, "stdin", parser, rejects, kind="stdin")
