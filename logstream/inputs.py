"""Reading backtest inputs (log files, session JSONL, label files) with bad-input accounting.

Bad input never raises a traceback: a file that cannot be used at all is an
`InputError` (one line, the CLI exits 2); a bad line inside a usable file is
counted by kind in `InputStats` and either repaired (invalid UTF-8 is decoded
with replacement, overlong lines are cut) or skipped (bad JSON, a session
JSON that is nested too deeply or has an impossible label, a line holding a
NUL byte past the first 8 KB, which are the only bytes checked for binary).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstream.errors import UserError
from logstream.normalize import MAX_LINE_CHARS
from logstream.regex import Pattern, RegexError, compile_safe, search_key
from logstream.train import Stream

FORMATS = ("lines", "sessions")


class InputError(UserError):
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


def _has_nul(raw: bytes, stats: InputStats) -> bool:
    """A NUL byte in a line (binary junk inside a text file): counted, and the line skipped."""
    if b"\x00" in raw:
        stats.bad["nul_byte"] += 1
        return True
    return False


def read_lines(path: Path, stats: InputStats, numbers: list[int] | None = None) -> list[str]:
    """All lines of a text log, in order (empty lines and lines with NUL bytes are counted and skipped).

    `numbers`, if given, gets each kept line's 1-based line number in the file (as an editor counts).
    """
    lines = []
    for number, raw in enumerate(_read_bytes(path).splitlines(), start=1):
        if not raw.strip():
            stats.bad["empty_line"] += 1
            continue
        if _has_nul(raw, stats):
            continue
        lines.append(_cut(_decode(raw, stats), stats))
        if numbers is not None:
            numbers.append(number)
    return lines


@dataclass(frozen=True)
class Session:
    id: str
    lines: list[str]
    label: int | None


class _BadSession(ValueError):
    """A session record that parses as JSON but is not a usable session."""


_SCALARS = (str, int, float, bool)


def _session(obj: Any, stats: InputStats) -> Session:
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
    return Session(
        _valid(str(ident)),
        [_cut(_valid(str(line)), stats) for line in lines],
        None if label is None else int(label),
    )


def _valid(text: str) -> str:
    """Lone surrogates (JSON may spell them `\\ud800`) become `?`: the tokenizer needs UTF-8."""
    return text.encode("utf-8", "replace").decode("utf-8")


def read_sessions(path: Path, stats: InputStats, numbers: list[int] | None = None) -> list[Session]:
    """Sessions JSONL: {"session": id, "lines": [...], "label": 0|1 (optional)} per line.

    A record that is not such an object (bad JSON, nested past the recursion limit,
    a label of 2 or 1e400) is counted as `bad_session_json` and skipped. `numbers`, if
    given, gets each kept session's 1-based line number in the file.
    """
    sessions = []
    for number, raw in enumerate(_read_bytes(path).splitlines(), start=1):
        if not raw.strip() or _has_nul(raw, stats):
            continue
        try:
            sessions.append(_session(json.loads(_decode(raw, stats)), stats))
            if numbers is not None:
                numbers.append(number)
        except (ValueError, RecursionError):  # JSONDecodeError, int digits limit, _BadSession
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


def stream_of(line: str, key: Pattern | None) -> str:
    """The stream a line belongs to: the regex's first group (or whole match), else 'default'."""
    if key is None:
        return "default"
    return search_key(key, line) or "default"


def compile_stream_key(pattern: str | None) -> Pattern | None:
    """`--stream-key`, compiled with RE2 (logstream.regex) so no log line can make it hang."""
    if pattern is None:
        return None
    try:
        return compile_safe(pattern)
    except RegexError as exc:
        raise InputError(f"--stream-key: {pattern!r} is {exc}") from None


def streams_from_lines(lines: list[str], key: Pattern | None) -> list[Stream]:
    by_stream: dict[str, list[str]] = {}
    for line in lines:
        by_stream.setdefault(stream_of(line, key), []).append(line)
    return [Stream(name, stream_lines) for name, stream_lines in by_stream.items()]


def streams_from_sessions(sessions: list[Session]) -> list[Stream]:
    return [Stream(s.id, s.lines, ended=True) for s in sessions]
