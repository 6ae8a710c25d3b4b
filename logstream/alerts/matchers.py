"""Label matchers in Alertmanager's syntax: `name="value"`, `!=`, `=~` and `!~`.

    severity="critical"     equal
    stream!="canary"        not equal
    team=~"db|storage"      the whole value matches the regex (anchored, as in Alertmanager)
    namespace!~"test-.*"    the whole value does not match

The value may be quoted or bare. Inside quotes `\\"` is a quote and `\\\\` a
backslash; any other backslash stays as written, so `=~"\\d+"` is the regex `\\d+`. A label an
anomaly does not carry has the value "", so `team=""` matches anomalies without a
team. Regexes run with RE2 (as Alertmanager's Go regexp does): label values come from
log lines, so no pattern may backtrack on them. The older `match: {label: glob}`
form is kept as `glob` matchers (`fnmatch`, e.g. `prod-*`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache

from logstream.regex import Pattern, compile_safe

OPERATORS = ("=~", "!~", "!=", "=")  # longest first: `=~` is not `=` followed by "~..."
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*")


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label condition; `op` is one of OPERATORS or "glob" (the legacy `match` form)."""

    name: str
    op: str
    value: str

    def __call__(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        if self.op == "glob":
            return fnmatchcase(value, self.value)
        found = _anchored(self.value).search(value) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        if self.op == "glob":
            return f"{self.name}={self.value}"
        quoted = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{quoted}"'


@lru_cache(maxsize=1024)
def _anchored(pattern: str) -> Pattern:
    return compile_safe(f"^(?:{pattern})$")


def parse_matcher(text: str) -> Matcher:
    """'team=~"db|storage"' -> Matcher; ValueError naming what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"a matcher is a string like 'team=\"db\"', not {type(text).__name__}")
    found = _MATCHER.fullmatch(text)
    if found is None:
        raise ValueError(f'not a matcher: {text!r} (use label="value", !=, =~ or !~)')
    name, op, raw = found.groups()
    value = _unquote(raw, text)
    if op in ("=~", "!~"):
        try:
            _anchored(value)
        except ValueError as exc:
            raise ValueError(f"matcher {text!r}: bad regex: {exc}") from None
    return Matcher(name, op, value)


def _unquote(raw: str, text: str) -> str:
    if not raw.startswith('"'):
        if '"' in raw:
            raise ValueError(f"matcher {text!r}: a stray quote in the value")
        return raw
    if len(raw) < 2 or not raw.endswith('"') or _escaped_end(raw):
        raise ValueError(f"matcher {text!r}: unterminated quoted value")
    out, chars = [], iter(raw[1:-1])
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            char = following if following in ('"', "\\") else char + following
        elif char == '"':
            raise ValueError(f'matcher {text!r}: a quote inside a quoted value must be escaped (\\")')
        out.append(char)
    return "".join(out)


def _escaped_end(raw: str) -> bool:
    """True when the closing quote is itself escaped (an odd run of backslashes before it)."""
    run = len(raw) - 1 - len(raw[:-1].rstrip("\\"))
    return run % 2 == 1


def globs(mapping: Mapping[str, str]) -> tuple[Matcher, ...]:
    """The legacy `{label: glob}` form as matchers."""
    return tuple(Matcher(name, "glob", str(glob)) for name, glob in mapping.items())


def matches(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """True when every matcher holds (no matchers: always)."""
    return all(m(labels) for m in matchers)


def is_label_name(name: str) -> bool:
    return _LABEL_NAME.fullmatch(name) is not None
