"""A replay's lines grouped by template: the anomaly table and the pattern view.

The detector mines templates online (Drain), so the first line of a new kind opens a
template with its exact text and the next one generalizes it (`ntpd ... synchronized to
<*>`): the same kind of line carries different template texts over time. Grouping re-mines
the distinct templates seen during the replay once more, so each group is one final
template; ten `synchronized to` lines from ten hosts are one row, with a count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from logstream.normalize import DEFAULT_RULES
from logstream.patterns import PatternMiner
from logstream.replay import Unit

_WORDS = re.compile(r"\w+(?:[.-]\w+)*")  # as logstream.explain names words
_TIMESTAMP = re.compile(next(r.pattern for r in DEFAULT_RULES if r.name == "timestamp"))


def log_time(line: str) -> str | None:
    """The line's own timestamp as written (the first one the masking rules recognize)."""
    match = _TIMESTAMP.search(line)
    return match.group() if match else None


@dataclass
class Group:
    """Items of one template, in file order."""

    template: str
    units: list[Unit] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.units)

    @property
    def first(self) -> int:
        return self.units[0].line

    @property
    def last(self) -> int:
        return self.units[-1].line

    @property
    def worst(self) -> Unit:
        return max(self.units, key=lambda u: u.score)

    @property
    def novel(self) -> bool:
        """Some line of the group opened a template the model had never seen."""
        return any(u.novel for u in self.units)

    @property
    def streams(self) -> list[str]:
        return sorted({u.stream for u in self.units})

    @property
    def first_time(self) -> str | None:
        return log_time(self.units[0].text)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "new_words": list(worst.new_words),
            "template": self.template, "count": self.count, "first_line": self.first,
            "last_line": self.last, "first_time": self.first_time, "novel": self.novel,
            "streams": self.streams[:20], "worst_score": round(worst.score, 4), "worst_line": worst.line,
            "example": worst.text,
            "explanation": worst.explanation.to_json() if worst.explanation else None,
        }  # fmt: skip


def final_templates(templates: Iterable[str]) -> dict[str, str]:
    """Each template text seen during a replay -> the template it belongs to after re-mining."""
    distinct = list(dict.fromkeys(templates))
    miner = PatternMiner()
    for text in distinct:
        miner.add(text)
    by_id = {t.id: t.text for t in miner.templates()}
    out = {}
    for text in distinct:
        found = miner.match(text)
        out[text] = by_id.get(found, text) if found is not None else text
    return out


def mark_new_words(units: list[Unit]) -> None:
    """Set `Unit.new_words`: the explained words of a line that no earlier line of its stream in
    this replay contains as a word. That is all it claims: the model's training data and lines
    before the file are not searched."""
    seen: dict[str, set[str]] = {}
    for u in sorted(units, key=lambda u: u.line):
        words = set(_WORDS.findall(u.text))
        history = seen.setdefault(u.stream, set())
        if u.explanation is not None:
            u.new_words = tuple(
                w.text for w in u.explanation.words if w.text in words and w.text not in history
            )
        history |= words


def why(u: Unit) -> str:
    """What the explanation says about a unit, and which of its words are new to its stream."""
    text = u.explanation.summary if u.explanation is not None else ""
    if u.new_words:
        text += f"; first time in {u.stream} in this replay: {', '.join(map(repr, u.new_words))}"
    return text


def group_by_template(units: Iterable[Unit]) -> list[Group]:
    """Units grouped by final template, each group in file order; groups by first line."""
    ordered = sorted(units, key=lambda u: u.line)
    final = final_templates(_key(u) for u in ordered)
    groups: dict[str, Group] = {}
    for u in ordered:
        template = final[_key(u)]
        groups.setdefault(template, Group(template)).units.append(u)
    return list(groups.values())


def anomaly_groups(patterns: list[Group]) -> list[Group]:
    """The anomalies of each pattern (`group_by_template` of all units), worst score first."""
    groups = [Group(g.template, [u for u in g.units if u.is_anomaly]) for g in patterns]
    return sorted((g for g in groups if g.units), key=lambda g: (-g.worst.score, g.first))


def _key(u: Unit) -> str:
    return u.template if u.template is not None else u.text
