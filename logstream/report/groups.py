"""A replay's lines grouped by template: the anomaly table and the pattern view, in bounded memory.

The detector mines templates online (Drain), so the first line of a new kind opens a
template with its exact text and the next one generalizes it (`ntpd ... synchronized to
<*>`): the same kind of line carries different template texts over time. Grouping re-mines
the distinct templates seen during the replay once more, so each group is one final
template; ten `synchronized to` lines from ten hosts are one row, with a count.

A replay may be longer than memory, so a group keeps no list of its items: `Grouper` adds
items as they are scored into one `TemplateGroup` per template text seen (counts, first and last
line, streams, the worst item and the first EXAMPLES), and `groups()` merges them into the
final templates at the end. Memory grows with the templates and streams, not the lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from logstream.text.normalize import DEFAULT_RULES
from logstream.text.patterns import PatternMiner

if TYPE_CHECKING:
    from logstream.replay import Unit

EXAMPLES = 2  # items kept per group besides the worst, the first in file order (the report shows them)
_WORDS = re.compile(r"\w+(?:[.-]\w+)*")  # as logstream.text.explain names words
_TIMESTAMP = re.compile(next(r.pattern for r in DEFAULT_RULES if r.name == "timestamp"))


def log_time(line: str) -> str | None:
    """The line's own timestamp as written (the first one the masking rules recognize)."""
    match = _TIMESTAMP.search(line)
    return match.group() if match else None


def _critical(u: Unit) -> bool:
    return u.anomaly is not None and u.anomaly.severity == "critical"


@dataclass
class TemplateGroup:
    """Items of one template, summarized: add them in file order (`add`), or `merge` two groups."""

    template: str
    worst: Unit  # the highest score; the first such in file order
    count: int = 1
    first: int = 0  # 1-based line of the first item in the file
    last: int = 0
    first_time: str | None = None  # the first item's own timestamp, as written
    novel: bool = False  # some line of the group opened a template the model had never seen
    critical: bool = False  # some alert of the group is critical (`ScoredLine.severity`)
    stream_set: set[str] = field(default_factory=set)
    examples: list[Unit] = field(default_factory=list)  # the first EXAMPLES items, in file order
    anomalies: TemplateGroup | None = None  # its items over the threshold (a pattern's; None: none)

    @classmethod
    def of(cls, template: str, u: Unit) -> TemplateGroup:
        """A group of one item."""
        return cls(
            template, u, first=u.line, last=u.line, first_time=log_time(u.text), novel=u.novel,
            critical=_critical(u), stream_set={u.stream}, examples=[u],
        )  # fmt: skip

    def add(self, u: Unit) -> None:
        """One more item, later in the file than those added before."""
        self.count += 1
        self.last = u.line
        self.novel |= u.novel
        self.critical |= _critical(u)
        self.stream_set.add(u.stream)
        if u.score > self.worst.score:
            self.worst = u
        if len(self.examples) < EXAMPLES:
            self.examples.append(u)

    def merge(self, other: TemplateGroup) -> None:
        """Take in another group's items (the template stays this one's)."""
        if other.first < self.first:
            self.first, self.first_time = other.first, other.first_time
        self.count += other.count
        self.last = max(self.last, other.last)
        self.novel |= other.novel
        self.critical |= other.critical
        self.stream_set |= other.stream_set
        if (other.worst.score, -other.worst.line) > (self.worst.score, -self.worst.line):
            self.worst = other.worst
        self.examples = sorted(self.examples + other.examples, key=lambda u: u.line)[:EXAMPLES]
        if other.anomalies is not None:
            if self.anomalies is None:
                self.anomalies = other.anomalies.renamed(self.template)
            else:
                self.anomalies.merge(other.anomalies)

    def renamed(self, template: str) -> TemplateGroup:
        """A copy under another template, to merge into without changing this one."""
        anomalies = self.anomalies.renamed(template) if self.anomalies is not None else None
        return replace(
            self, template=template, stream_set=set(self.stream_set), examples=list(self.examples),
            anomalies=anomalies,
        )  # fmt: skip

    @property
    def streams(self) -> list[str]:
        return sorted(self.stream_set)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "new_words": list(worst.new_words),
            "template": self.template, "count": self.count, "first_line": self.first,
            "last_line": self.last, "first_time": self.first_time, "novel": self.novel,
            "critical": self.critical,
            "streams": self.streams[:20], "worst_score": round(worst.score, 4), "worst_line": worst.line,
            "example": worst.text,
            "explanation": worst.explanation.to_json() if worst.explanation else None,
        }  # fmt: skip


class Grouper:
    """Groups units as they are scored (in file order); `groups()` gives the final patterns."""

    def __init__(self) -> None:
        self.by_text: dict[str, TemplateGroup] = {}  # template text as mined -> its items so far

    def add(self, u: Unit) -> None:
        key = u.template if u.template is not None else u.text
        group = self.by_text.get(key)
        if group is None:
            group = self.by_text[key] = TemplateGroup.of(key, u)
        else:
            group.add(u)
        if u.is_anomaly:
            if group.anomalies is None:
                group.anomalies = TemplateGroup.of(key, u)
            else:
                group.anomalies.add(u)

    def units(self) -> Iterable[Unit]:
        """Every unit kept (the worst and the first few of each group): a bounded number."""
        for g in self.by_text.values():
            for group in (g, g.anomalies):
                if group is not None:
                    yield group.worst
                    yield from group.examples

    def groups(self) -> list[TemplateGroup]:
        """One group per final template (`final_templates`), by first line."""
        final = final_templates(self.by_text)
        merged: dict[str, TemplateGroup] = {}
        for text, group in self.by_text.items():
            template = final[text]
            if template in merged:
                merged[template].merge(group)
            else:
                merged[template] = group.renamed(template)
        return sorted(merged.values(), key=lambda g: g.first)


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


def mark_new_words(units: Iterable[Unit], lines: Iterable[tuple[int, str, str]]) -> None:
    """Set `Unit.new_words`: the explained words of a line that no earlier line of its stream in
    this replay contains as a word. That is all it claims: the model's training data and lines
    before the file are not searched.

    `lines`: (line number, stream, text) of every scored line, in file order (read again: only
    the words asked about are remembered)."""
    asked = {u.line: (u, u.explanation) for u in units if u.explanation is not None}
    wanted: dict[str, set[str]] = {}  # stream -> the words asked about in it
    for u, explanation in asked.values():
        wanted.setdefault(u.stream, set()).update(w.text for w in explanation.words)
    seen: dict[str, set[str]] = {}
    for line, stream, text in lines:
        if stream not in wanted:
            continue
        words = set(_WORDS.findall(text))
        history = seen.setdefault(stream, set())
        if line in asked:
            u, explanation = asked[line]
            u.new_words = tuple(
                w.text for w in explanation.words if w.text in words and w.text not in history
            )
        history |= words & wanted[stream]


def why(u: Unit) -> str:
    """What the explanation says about a unit, and which of its words are new to its stream."""
    text = u.explanation.summary if u.explanation is not None else ""
    if u.new_words:
        text += f"; first time in {u.stream} in this replay: {', '.join(map(repr, u.new_words))}"
    return text


def group_by_template(units: Iterable[Unit]) -> list[TemplateGroup]:
    """Units (in any order) grouped by final template; groups by first line."""
    grouper = Grouper()
    for u in sorted(units, key=lambda u: u.line):
        grouper.add(u)
    return grouper.groups()


def anomaly_groups(patterns: list[TemplateGroup]) -> list[TemplateGroup]:
    """The anomalies of each pattern (`Grouper.groups`), worst score first."""
    groups = [g.anomalies for g in patterns if g.anomalies is not None]
    return sorted(groups, key=lambda g: (-g.worst.score, g.first))
