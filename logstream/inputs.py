"""Reading backtest inputs (log files, session JSONL, label files) with bad-input accounting.

Bad input never raises a traceback: a file that cannot be used at all is an
`InputError` (one line, the CLI exits 2); a bad line inside a usable file is
counted by kind in `InputStats` and either repaired (invalid UTF-8 is decoded
with replacement, overlong lines are cut) or skipped (bad JSON).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from logstream.normalize import MAX_LINE_CHARS
from logstream.train import Stream

FORMATS = ("lines", "sessions")


class InputError(Exception):
    """The input cannot be used at all (missing, empty, binary, mismatched labels)."""


@dataclass
class InputStats:
    bad: Counter[str] = field(default_factory=Counter)  # kind -> count

    def as_dict(self) -> dict[str, int]:
        return dict(self.bad)


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.strip():
        raise InputError(f"{path}: file is empty")
    if b"\x00" in data[:8192]:
        raise InputError(f"{path}: looks like a binary file (NUL bytes), not a text log")
    return data


def _decode(raw: bytes, stats: InputStats) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.bad["invalid_utf8"] += 1
        return raw.decode("utf-8", errors="replace")


def _cut(line: str, stats: InputStats) -> str:
    if len(line) > MAX_LINE_CHARS:
        stats.bad["oversized_line"] += 1
        return line[:MAX_LINE_CHARS]
    return line


def read_lines(path: Path, stats: InputStats) -> list[str]:
    """All lines of a text log, in order (empty lines are counted and skipped)."""
    lines = []
    for raw in _read_bytes(path).splitlines():
        if not raw.strip():
            stats.bad["empty_line"] += 1
            continue
        lines.append(_cut(_decode(raw, stats), stats))
    return lines


@dataclass(frozen=True)
class Session:
    id: str
    lines: list[str]
    label: int | None


def read_sessions(path: Path, stats: InputStats) -> list[Session]:
    """Sessions JSONL: {"session": id, "lines": [...], "label": 0|1 (optional)} per line."""
    sessions = []
    for raw in _read_bytes(path).splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(_decode(raw, stats))
            lines = [_cut(str(line), stats) for line in obj["lines"]]
            label = obj.get("label")
            sessions.append(Session(str(obj["session"]), lines, None if label is None else int(label)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            stats.bad["bad_session_json"] += 1
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


def stream_of(line: str, key: re.Pattern[str] | None) -> str:
    """The stream a line belongs to: the regex's first group (or whole match), else 'default'."""
    if key is None:
        return "default"
    match = key.search(line)
    if match is None:
        return "default"
    return match.group(1) if key.groups else match.group(0)


def compile_stream_key(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InputError(f"--stream-key: invalid regex {pattern!r}: {exc}") from None


def streams_from_lines(lines: list[str], key: re.Pattern[str] | None) -> list[Stream]:
    by_stream: dict[str, list[str]] = {}
    for line in lines:
        by_stream.setdefault(stream_of(line, key), []).append(line)
    return [Stream(name, stream_lines) for name, stream_lines in by_stream.items()]


def streams_from_sessions(sessions: list[Session]) -> list[Stream]:
    return [Stream(s.id, s.lines, ended=True) for s in sessions]
