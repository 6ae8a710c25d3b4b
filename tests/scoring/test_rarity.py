"""Rarity evidence: the counts behind it, that it is a p-value, what it says of a storm and of
a template that becomes common, and how it joins the words' evidence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logstream.scoring.calibration import novelty
from logstream.scoring.rarity import TemplateCounts


def test_the_lines_at_most_as_common_are_counted_exactly() -> None:
    """The tree's count of lines in templates of at most c lines is the plain sum, after
    every add, through the tree's growth past its first 64 counts."""
    rng = np.random.default_rng(0)
    counts = TemplateCounts([(0, 3), (1, 100)])
    plain = {0: 3, 1: 100}
    for _ in range(3000):
        template = int(rng.zipf(1.6)) % 50
        lines = int(rng.choice([1, 1, 1, 7]))
        counts.add(template, lines)
        plain[template] = plain.get(template, 0) + lines
        for c in (1, 2, 5, 63, 64, 65, 200, 10_000):
            assert counts.at_most(c) == sum(n for n in plain.values() if n <= c)
    assert counts.total == sum(plain.values())
    with pytest.raises(ValueError, match="not positive"):
        counts.add(3, 0)


def test_on_a_stream_drawn_at_fixed_rates_the_evidence_is_a_p_value() -> None:
    """Templates at fixed Zipf-like rates, 300 of them, after a baseline drawn the same way:
    no more than 10**-t of the lines reach evidence t."""
    rng = np.random.default_rng(1)
    weights = 1.0 / np.arange(1, 301)
    draw = rng.choice(300, size=40_000, p=weights / weights.sum()).tolist()
    baseline = np.bincount(draw[:10_000], minlength=300)
    counts = TemplateCounts((t, int(n)) for t, n in enumerate(baseline) if n)
    evidence = np.array([counts.observe(t) for t in draw[10_000:]])
    for t in (0.5, 1.0, 2.0, 3.0):
        assert np.mean(evidence >= t) <= 10**-t, t


def test_a_storm_stays_rare_while_a_template_that_becomes_common_fades() -> None:
    """After 2,000 baseline lines of 10 templates: a new template's 20 lines in a row all keep
    evidence past 2 (one in 100), the model's context may copy them but the system's history
    has few; the same template, once it is half of the lines, has next to none."""
    counts = TemplateCounts((t, 200) for t in range(10))
    storm = [counts.observe(99) for _ in range(20)]
    assert min(storm) > 2.0
    assert storm == sorted(storm, reverse=True)  # each copy a little less rare
    for _ in range(2000):
        counts.observe(99)
    assert counts.observe(99) < 0.1


def test_the_stronger_of_words_and_rarity_is_still_a_p_value() -> None:
    """Novelty takes the stronger of two p-values at twice its p: no more than 10**-t of the
    lines pass t whether the two are independent or the same, and a line whose words and
    rarity say nothing scores 0, not less."""
    rng = np.random.default_rng(2)
    words, rarity = -np.log10(rng.uniform(size=(2, 200_000)))
    for other in (rarity, words):
        new = np.array([novelty(w, r) for w, r in zip(words, other, strict=True)])
        for t in (1.0, 2.0, 3.0):
            assert np.mean(new > t) <= 10**-t * 1.1, t
    assert novelty(2.5, None) == 2.5
    assert novelty(0.1, 0.2) == 0.0
    assert novelty(1.0, 4.0) == pytest.approx(4.0 - math.log10(2))


def test_forgotten_templates_take_their_lines_with_them() -> None:
    """A miner evicts templates it has not seen for long: their counts go, and the shares are
    those of the lines that remain, as if the forgotten ones had never been counted."""
    counts = TemplateCounts([(1, 50), (2, 30), (3, 5), (4, 1)])
    counts.keep_only({1, 3})
    assert counts.counts == {1: 50, 3: 5} and counts.total == 55
    assert counts.at_most(30) == 5 and counts.at_most(50) == 55
    assert counts.observe(3) == pytest.approx(-math.log10(6 / 56))
