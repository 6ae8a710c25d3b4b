"""A line's level: its level field, or the failure words anywhere in it.

Many real logs have no level field (syslog, kernel, sshd) and say what went wrong in words, in
any case: `Connection refused`, `authentication failure`, `kernel panic`. So a line's level is
the higher of its level field and the failure words it contains, except that a line its
writer marked debug or info keeps that level: the writer judged it routine (Hadoop logs
`INFO ... Cannot assign container` by the hundred). The level is the score's prior
(`scoring.calibration`): how much a failure weighs, whatever the baseline made of it.

The words are regexes matched case-insensitively on word boundaries; a word right after
`no `, `0 ` or `without ` does not count (`0 errors`, `no error`), nor does one followed
later in the line by a *success word* (`enabled`, `supported`, `done`, `ok`, ...): such a
line reports that a failure-handling feature works (`machine check reporting enabled`), not
a failure. Both lists are saved in the model directory, so a user can edit them there or
pass their own to `ScoringConfig`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from logstream.text.normalize import MAX_LINE_CHARS, parse_level

LEVEL_RANK = {"debug": 0, "info": 1, "warning": 2, "error": 3, "critical": 4}
ROUTINE_LEVELS = ("debug", "info")  # a level field its writer chose for routine lines: words do not raise it

# Syslog's (RFC 5424) and the logging libraries' level names and the common failure verbs: a
# generic vocabulary, not words read off any one log ...
GENERIC_FAILURE_WORDS: dict[str, tuple[str, ...]] = {
    "critical": ("fatal", "panic", "emerg(?:ency)?", "critical"),
    "error": (
        "errors?", "fail(?:ed|s|ure|ures)?", "exceptions?", "denied", "refused", "time(?:d)? ?out",
        "timeouts?", "abort(?:ed|ing)?", "crash(?:ed|es)?", "unreachable", "cannot", "unable to", "killed",
    ),
    "warning": ("warn(?:ing)?s?", "retry(?:ing)?", "degraded", "deprecated"),
}  # fmt: skip
# ... and the names that kernels and runtimes give specific failures. benchmarks/quality.py
# measures the level field alone, the generic words, and both lists, leave one log out; the
# default is what it chose (docs/quality.md).
SPECIFIC_FAILURE_WORDS: dict[str, tuple[str, ...]] = {
    "critical": ("oom", "out of memory", "segfault", "segmentation fault", "core dumped", "kernel bug",
                 "corrupt(?:ed|ion)?", "machine check"),
    "error": ("faults?", "faulty", "read-only", "i/o error", "traceback"),
    "warning": (),
}  # fmt: skip
DEFAULT_FAILURE_WORDS = {
    level: GENERIC_FAILURE_WORDS[level] + SPECIFIC_FAILURE_WORDS[level] for level in GENERIC_FAILURE_WORDS
}
DEFAULT_SUCCESS_WORDS = ("enabled", "supported", "done", "ok", "succeeded", "successful(?:ly)?")


def _first_character(word: str) -> str | None:
    """The character every match of the regex `word` starts with, when that is plain to see:
    it begins with a letter or digit that no quantifier makes optional, and has no
    alternation outside a group (`fail(?:ed|s)?`, `out of memory`); else None."""
    if not word[:1].isalnum() or word[1:2] in ("?", "*", "{"):
        return None
    depth, escaped, in_class = 0, False, False
    for ch in word:  # a misread class only finds more top-level `|`s: None, the safe answer
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "|" and depth == 0:
            return None
    return word[0]


def _words_regex(words: Iterable[str]) -> re.Pattern[str]:
    """Any of `words` on word boundaries, not right after `no `, `0 ` or `without `. Most
    word starts begin no failure word: a lookahead on the words' first characters leaves
    them after one test, where trying every word there cost 3.5x as much (loghub lines)."""
    words = list(words)
    firsts = [_first_character(w) for w in words]
    ahead = "" if None in firsts else "(?=[" + "".join(sorted({c for c in firsts if c})) + "])"
    return re.compile(
        r"\b" + ahead + r"(?<!\bno )(?<!\b0 )(?<!without )(?:" + "|".join(words) + r")\b", re.IGNORECASE
    )


_Compiled = tuple[re.Pattern[str] | None, tuple[tuple[str, re.Pattern[str]], ...], re.Pattern[str] | None]


@lru_cache(maxsize=16)
def _compile(words: tuple[tuple[str, tuple[str, ...]], ...], success_words: tuple[str, ...]) -> _Compiled:
    """A regex for any failure word (None if there are none), one per level, highest
    first, and one for any success word (None if there are none). Most lines have no failure
    word: one search over all words settles them, at half the cost of one search per
    level."""
    by_rank = [(level, w) for level, w in sorted(words, key=lambda item: -LEVEL_RANK[item[0]]) if w]
    every_word = [word for _, w in by_rank for word in w]
    return (
        _words_regex(every_word) if every_word else None,
        tuple((level, _words_regex(w)) for level, w in by_rank),
        re.compile(r"\b(?:" + "|".join(success_words) + r")\b", re.IGNORECASE) if success_words else None,
    )


def _key(words: dict[str, tuple[str, ...]] | dict[str, list[str]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(sorted((level, tuple(w)) for level, w in words.items()))


def check_level_words(words: dict[str, list[str]], success_words: list[str]) -> None:
    """Raise ValueError naming the bad level or regex."""
    for level in words:
        if level not in LEVEL_RANK:
            raise ValueError(f"failure_words: unknown level {level!r}; expected one of {list(LEVEL_RANK)}")
    named = [(f"failure_words.{level}", p) for level, patterns in words.items() for p in patterns]
    for name, pattern in [*named, *(("success_words", p) for p in success_words)]:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{name}: invalid regex {pattern!r}: {exc}") from None


def line_level(
    line: str,
    words: dict[str, tuple[str, ...]] | dict[str, list[str]] | None = None,
    success_words: Iterable[str] = DEFAULT_SUCCESS_WORDS,
) -> str | None:
    """The higher of the line's level field and its failure words (None if it has neither);
    a debug or info level field is kept as it is."""
    text = line[:MAX_LINE_CHARS]
    level = parse_level(text)
    if level in ROUTINE_LEVELS:
        return level
    any_word, by_level, success = _compile(
        _key(DEFAULT_FAILURE_WORDS if words is None else words), tuple(success_words)
    )
    found = any_word.search(text) if any_word is not None else None
    if found is None:
        return level
    start = 0  # failure words count from here on: after the last success word
    after = [m.end() for m in success.finditer(text, found.end())] if success is not None else []
    if after:
        start = after[-1]
        if not any_word.search(text, start):
            return level
    for word_level, regex in by_level:
        if level is not None and LEVEL_RANK[level] >= LEVEL_RANK[word_level]:
            break
        if regex.search(text, start):
            return word_level
    return level
