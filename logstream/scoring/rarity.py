"""Rarity: how rare a line's template is among all the lines the model has read.

A model counts its baseline's lines per template (saved with it, `template_counts`); the
scorer goes on counting every line it scores. A line's rarity evidence is

    -log10 (lines so far whose template holds at most as many lines as this one's) / (lines so far)

the line itself included: a p-value with no fitted tail, since a line drawn from the lines so
far is this rare with at most that probability. It says what the model's words cannot: a
storm's tenth line copies its first, and the model, which reads the window, finds it
ordinary, while its template is still rare in the system's history; and a template that
becomes common (a new job's lines, a long outage) fades as it recurs, where the model would
find each of its lines as new as the first.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable


class TemplateCounts:
    """Lines per template, and how many lines are in templates at most as common as one: a
    Fenwick tree over counts, O(log lines) a line."""

    def __init__(self, counts: Iterable[tuple[int, int]] = ()) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self._tree = [0] * 65  # tree[c], c = 1..64: lines in templates of count in (c - lowbit(c), c]
        for template, lines in counts:
            self.add(template, lines)

    def add(self, template: int, lines: int = 1) -> None:
        """Count `lines` more lines of `template`."""
        if lines < 1:
            raise ValueError(f"lines: {lines} is not positive")
        before = self.counts.get(template, 0)
        after = self.counts[template] = before + lines
        self.total += lines
        if after >= len(self._tree):
            self._grow(after)
            return  # the rebuild counted the template at `after`
        if before:
            self._update(before, -before)
        self._update(after, after)

    def at_most(self, count: int) -> int:
        """Lines in templates that hold at most `count` lines."""
        i, lines = min(count, len(self._tree) - 1), 0
        while i > 0:
            lines += self._tree[i]
            i -= i & -i
        return lines

    def evidence(self, template: int) -> float:
        """-log10 of the share of lines so far in templates at most as common as `template`."""
        return -math.log10(self.at_most(self.counts[template]) / self.total)

    def observe(self, template: int) -> float:
        """Count one line of `template`, and return its evidence."""
        self.add(template)
        return self.evidence(template)

    def keep_only(self, templates: Container[int]) -> None:
        """Forget every other template and its lines: the miner evicts the least recently seen
        templates, and their counts must not stay here forever."""
        for template in [t for t in self.counts if t not in templates]:
            lines = self.counts.pop(template)
            self.total -= lines
            self._update(lines, -lines)

    def _update(self, count: int, lines: int) -> None:
        while count < len(self._tree):
            self._tree[count] += lines
            count += count & -count

    def _grow(self, count: int) -> None:
        size = len(self._tree) - 1
        while size < count:
            size *= 2
        self._tree = [0] * (size + 1)
        for lines in self.counts.values():
            self._update(lines, lines)
