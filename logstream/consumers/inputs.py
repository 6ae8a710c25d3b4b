"""Reading backtest and training inputs (log files, session JSONL, label files) with bad-input accounting.

A log line takes serve's path: `consumers.file.read_file` reads it and the
`RecordParser` (`line_parser`) judges it, so replay, `train`, `tail` and serve
score and skip exactly the same lines, and compute the stream key in one place
(`RecordParser`, for a plain line the `--stream-key` regex). A line the parser
rejects (undecodable bytes, a NUL byte, over `max_message_bytes`, blank) is counted by
kind in `InputStats` and skipped; a session's lines go through the same parser.

A NUL byte makes a line bad input wherever it is (`binary`): a file is never refused for
one such line, only when its start holds no text line at all (a core dump), or when no
line is left to score.

Bad input never raises a traceback: a file that cannot be used at all is an
`InputError` (one line, the CLI exits 2); a bad session record (bad JSON, nested
too deeply, an impossible label) is counted as `bad_session_json` and skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from logstream.consumers.file import read_file
from logstream.consumers.multiline import JoinStats, join_records, joiner_for
from logstream.consumers.parse import RecordParser, Rejected, RejectLog
from logstream.errors import UserError
from logstream.records import LogRecord, Stream
from logstream.regex import Pattern, RegexError, compile_safe
from logstream.settings import InputSettings, MultilineSettings
from logstream.text.event_time import with_event_time

FORMATS = ("lines", "sessions")
STDIN = "-"  # an input name that means standard input (`logstream tail -`)
SNIFF_BYTES = 8192  # a file whose start holds NUL bytes and no text line is refused as binary


class InputError(UserError):
    """The input cannot be used at all (missing, empty, binary, mismatched labels)."""


class InputStats(RejectLog):
    """Bad input by kind: the parser's rejects (as serve counts them) and bad session records."""

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def bad(self) -> dict[str, int]:
        return {kind: n for kind, n in self.counts.items() if n}

    def as_dict(self) -> dict[str, int]:
        return self.bad


class Reread(InputStats):
    """For a file read again after its bad input was counted: nothing is counted or logged twice."""

    def add(self, rejected: Rejected, **context: Any) -> None:
        pass


def line_parser(
    stream_key: str | None = None,
    max_message_bytes: int = InputSettings().max_message_bytes,
    multiline: MultilineSettings | None = None,
) -> RecordParser:
    """Plain lines, as replay, `tail` and a plain-format serve read them; the stream is the
    `stream_key` regex's first group (or whole match), else `default`. `multiline`: how
    `read_records` and `tail` join multi-line events (default: not at all)."""
    compile_stream_key(stream_key)  # a bad regex is one line naming --stream-key
    settings = InputSettings(
        format="plain", stream_key="regex" if stream_key else "none", stream_regex=stream_key,
        max_message_bytes=max_message_bytes, multiline=multiline or MultilineSettings(),
    )  # fmt: skip
    return RecordParser(settings)


def multiline_option(value: str) -> MultilineSettings:
    """`--multiline`: auto, off, start:REGEX or continue:REGEX (`settings.MultilineSettings`)."""
    mode, colon, pattern = value.partition(":")
    if mode not in ("auto", "off", "start", "continue") or (mode in ("auto", "off")) == bool(colon):
        raise InputError(f"--multiline: {value!r}; expected auto, off, start:REGEX or continue:REGEX")
    try:
        return MultilineSettings(mode=mode, pattern=pattern or None)
    except (ValidationError, RegexError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise InputError(f"--multiline {value!r}: {reason.removeprefix('Value error, ')}") from None


def check_file(path: Path) -> None:
    """Refuse a path that is not a usable log file at all, saying what it is and what to give
    instead (its lines are judged one by one as they are read)."""
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a log file; give the files in it ({path}/*.log)")
    if not path.exists():
        raise InputError(f"{path}: no such file; check the path")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file; give a log file (or - for stdin where it is read)")
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
            empty = not head.strip() and not handle.read().strip()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read: {exc.strerror}") from None
    if empty:
        raise InputError(f"{path}: file is empty")
    if b"\x00" in head and not any(map(_text_line, head.split(b"\n")[:-1] or [head])):
        raise InputError(
            f"{path}: looks like a binary file (no text line in its first 8 KiB), not a text log"
        )


def _text_line(raw: bytes) -> bool:
    """A line a text log could hold: not blank, UTF-8, no NUL byte."""
    try:
        return bool(raw.strip()) and b"\x00" not in raw and bool(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def read_records(
    path: Path, stats: InputStats, parser: RecordParser | None = None, joins: JoinStats | None = None
) -> Iterator[LogRecord]:
    """The file's records in order, as serve's parser makes them (bad lines counted and skipped),
    each with the event time at the start of its line; `offset` is the 0-based line in the file.
    Multi-line events are joined as the parser's settings say (`consumers.multiline`; `joins`
    counts them).

    The file is checked when this is called; its lines are read as they are consumed."""
    path = Path(path)
    check_file(path)
    parser = parser or line_parser()
    records = with_event_time(read_file(path, parser, stats))
    return join_records(records, joiner_for(parser.settings, joins))


def no_line_to_score(path: Path, stats: InputStats) -> InputError:
    """The error for a file whose every line was bad input (which kinds, and what it may be)."""
    bad = stats.as_dict()
    kinds = ", ".join(f"{kind}={n}" for kind, n in bad.items()) or "none"
    binary = "; it looks like a binary file, not a text log" if bad.get("binary") else ""
    return InputError(f"{path}: no line to score (bad lines skipped: {kinds}){binary}")


def read_lines(path: Path, stats: InputStats) -> list[str]:
    """All kept lines of a text log, in order (see `read_records`)."""
    return [record.line for record in read_records(path, stats)]


def _read_bytes(path: Path) -> bytes:
    check_file(path)
    return path.read_bytes()


@dataclass(frozen=True)
class Session:
    id: str
    lines: list[str]
    label: int | None


class _BadSession(ValueError):
    """A session record that parses as JSON but is not a usable session."""


_SCALARS = (str, int, float, bool)


def _session(obj: Any, stats: InputStats, parser: RecordParser) -> Session:
    if not isinstance(obj, dict):
        raise _BadSession("not an object")
    ident, lines, label = obj.get("session"), obj.get("lines"), obj.get("label")
    if not isinstance(ident, _SCALARS) or not isinstance(lines, list):
        raise _BadSession("needs a scalar 'session' and a list 'lines'")
    if not all(isinstance(line, _SCALARS) for line in lines):
        raise _BadSession("'lines' holds a non-scalar")  # str() of a deep list could recurse
    if label in ("0", "1"):
        label = int(label)  # a label written as a string is still a label
    if label is not None and label not in (0, 1):
        raise _BadSession("'label' must be 0 or 1")  # also refuses 1e400 (inf) and NaN
    # lone surrogates (JSON may spell them `\\ud800`) become `?`: the parser reads UTF-8 bytes
    raw = (str(line).encode("utf-8", "replace") for line in lines)
    return Session(
        str(ident).encode("utf-8", "replace").decode("utf-8"),
        [record.line for record in _parsed(raw, parser, stats)],
        None if label is None else int(label),
    )


def _parsed(raw_lines: Iterable[bytes], parser: RecordParser, stats: InputStats) -> Iterator[LogRecord]:
    for raw in raw_lines:
        parsed = parser.parse(raw)
        if isinstance(parsed, Rejected):
            stats.add(parsed)
        else:
            yield parsed


def read_sessions(path: Path, stats: InputStats, numbers: list[int] | None = None) -> list[Session]:
    """Sessions JSONL: {"session": id, "lines": [...], "label": 0|1 (optional)} per line.

    A record that is not such an object (bad JSON, nested past the recursion limit,
    a label of 2 or 1e400) is counted as `bad_session_json` and skipped. `numbers`, if
    given, gets each kept session's 1-based line number in the file.
    """
    sessions = []
    parser = line_parser()
    for number, raw in enumerate(_read_bytes(path).splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            sessions.append(_session(json.loads(raw.decode("utf-8", errors="replace")), stats, parser))
            if numbers is not None:
                numbers.append(number)
        except (ValueError, RecursionError):  # JSONDecodeError, int digits limit, _BadSession
            stats.count("bad_session_json")
    if not sessions:
        raise InputError(f"{path}: no valid sessions (expected JSONL with 'session' and 'lines')")
    return sessions


def read_labels(path: Path, expected: int) -> list[int]:
    text = _read_bytes(path).decode("utf-8", errors="replace")
    tokens = text.split()
    if any(t not in ("0", "1") for t in tokens):
        raise InputError(f"{path}: labels must be 0 or 1, one per input line")
    if len(tokens) != expected:
        raise InputError(f"{path}: {len(tokens)} labels for {expected} input lines; counts must match")
    return [int(t) for t in tokens]


def compile_stream_key(pattern: str | None) -> Pattern | None:
    """`--stream-key`, compiled with RE2 (logstream.regex) so no log line can make it hang."""
    if pattern is None:
        return None
    try:
        return compile_safe(pattern)
    except RegexError as exc:
        raise InputError(f"--stream-key: {pattern!r} is {exc}") from None


def streams_from_records(records: Iterable[LogRecord]) -> list[Stream]:
    """Records grouped by their stream, in order of first appearance (training's input)."""
    by_stream: dict[str, list[str]] = {}
    for record in records:
        by_stream.setdefault(record.stream, []).append(record.line)
    return [Stream(name, stream_lines) for name, stream_lines in by_stream.items()]


def parse_lines(lines: Iterable[str], stream_key: str | None = None) -> list[LogRecord]:
    """Lines already in memory (generated, or a slice of a file) as the parser makes them;
    offset: the line's 0-based index. Bad lines are skipped (counted nowhere: the caller made them)."""
    parser = line_parser(stream_key)
    parsed = (parser.parse(line.encode("utf-8", "replace"), offset=i) for i, line in enumerate(lines))
    return [record for record in parsed if isinstance(record, LogRecord)]


def streams_from_lines(lines: Iterable[str], stream_key: str | None = None) -> list[Stream]:
    """Lines grouped into streams by the `stream_key` regex (as the parser keys them)."""
    return streams_from_records(parse_lines(lines, stream_key))


def streams_from_sessions(sessions: list[Session]) -> list[Stream]:
    return [Stream(s.id, s.lines, ended=True) for s in sessions]
