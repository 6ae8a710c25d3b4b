"""Log text made safe for a terminal: control characters shown, never obeyed.

A log line is written by whoever can reach the log, and a terminal obeys what it prints:
`ESC ] 0 ; title BEL` retitles the window, `ESC [ 2 J` clears the screen,
`ESC ] 8 ; ; URL ESC \\ text ...` shows a link whose text hides where it goes, and a
right-to-left override (U+202E) turns the rest of a line around. So every line logstream
prints for a person (tail, replay's tables, an error quoting a line) passes `printable`:
C0 and C1 control characters (ESC, BEL, CR, backspace, the 8-bit CSI U+009B ...), DEL and
the bidirectional overrides and isolates become Python-style escapes (`\\x1b`, `\\u202e`),
so a sequence shows as text and starts nothing. A tab stays a tab (stack-trace frames
are indented with one) and so does a newline where the caller allows it (the lines of
a multi-line event, which logstream itself joined). JSON output needs none of this:
`json.dumps` escapes every control character already.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BIDI}]")
_UNSAFE_KEEPING_NEWLINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every control character a terminal could act on escaped; with `newlines`,
    line breaks are kept (the caller's own line structure, e.g. a joined stack trace)."""
    return (_UNSAFE_KEEPING_NEWLINES if newlines else _UNSAFE).sub(_escape, text)
