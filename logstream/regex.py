"""User-supplied regexes, compiled so that no input line can make them hang.

Python's `re` backtracks: `(a+)+$` takes exponential time on a line of a few
dozen `a`s followed by `!`, and a stream key runs on every line of an
untrusted source. So stream-key regexes (serve's `input.stream_regex`,
train/replay's `--stream-key`) are compiled with RE2, which matches in time
linear in the line, whatever the pattern. RE2 refuses what it cannot do in
linear time (backreferences, lookaround); that is a clear error at start.
Trade-off: in RE2 `\\d`, `\\w` and `\\s` are ASCII-only.

`kafka.topic_pattern` must stay a Python regex (aiokafka matches it against
topic names with `re`), so it is checked twice instead: it must compile with
RE2 too, and nested quantifiers (`(a+)+`, `(\\w*)*`) are refused.
"""

from __future__ import annotations

import re
from re import _parser as sre_parse  # the parse tree of a Python regex (CPython >= 3.11)
from typing import Any, Protocol

import re2

from logstream.errors import UserError

_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT}


class RegexError(UserError, ValueError):
    """A user regex that cannot be used; the message says why (the caller names the field)."""


class SafeMatch(Protocol):
    def group(self, index: int = 0, /) -> Any: ...


class Pattern(Protocol):
    """What both `re.Pattern` and an RE2 pattern offer: enough for a stream key."""

    @property
    def groups(self) -> int: ...

    def search(self, text: str, /) -> SafeMatch | None: ...


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the error is raised to the caller; RE2's own stderr log is noise
    return options


def compile_safe(pattern: str) -> Pattern:
    """Compile `pattern` with RE2 (linear-time matching); RegexError if RE2 cannot compile it."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args else ""
        if _python_compiles(pattern):
            raise RegexError(
                f"RE2 cannot run it ({reason}): backreferences and lookaround need backtracking, "
                "which one log line could make hang"
            ) from None
        raise RegexError(f"not a valid regex: {reason}") from None
    except (UnicodeError, TypeError, ValueError) as exc:
        raise RegexError(f"not a valid regex: {exc}") from None


def _python_compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def search_key(pattern: Pattern, line: str) -> str | None:
    """The stream key in `line`: group 1 if the pattern has groups, else the whole match; None if none."""
    hit = pattern.search(line)
    if hit is None:
        return None
    found = hit.group(1) if pattern.groups else hit.group(0)
    return None if found is None else str(found)


def check_python_regex(pattern: str) -> re.Pattern[str]:
    """A regex that must run on Python's `re`: compiles in both engines, no nested quantifiers."""
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise RegexError(f"not a valid regex: {exc}") from None
    compile_safe(pattern)
    if has_nested_quantifier(pattern):
        raise RegexError("nested quantifiers (like '(a+)+') can backtrack for ever; simplify the pattern")
    return compiled


def has_nested_quantifier(pattern: str) -> bool:
    """True if a repeated group contains another unbounded-ish repeat (star height > 1)."""
    return _nested(sre_parse.parse(pattern), inside_repeat=False)


def _nested(items: Any, inside_repeat: bool) -> bool:
    for op, arg in items:
        if op in _REPEATS:
            _low, high, sub = arg
            repeats = high is sre_parse.MAXREPEAT or high > 1
            if (repeats and inside_repeat) or _nested(sub, inside_repeat or repeats):
                return True
        elif any(_nested(sub, inside_repeat) for sub in _subpatterns(op, arg)):
            return True
    return False


def _subpatterns(op: Any, arg: Any) -> list[Any]:
    """The nested sequences of a non-repeat node: groups, branches, lookarounds, conditionals."""
    if op is sre_parse.SUBPATTERN:
        return [arg[-1]]
    if op is sre_parse.BRANCH:
        return list(arg[1])
    if op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        return [arg[1]]
    if op is sre_parse.GROUPREF_EXISTS:
        return [b for b in arg[1:] if b is not None]
    return []
