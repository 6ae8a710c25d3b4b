"""The simple peers every quality figure is measured beside: no model, the same lines.

- severity: a one-line regex on level and failure words, ranked (fatal/panic/critical >
  error/fail/exception > warn); flags error and above;
- online rarity: Drain templates mined online from the baseline's first line on; a line scores
  -log10 of its template's share of the lines so far, and alerts below RARITY (1 in 1,000);
- severity then rarity: the severity rank first, rarity within a rank; flags a line of error
  rank or above whose template is rarer than sqrt(RARITY).
For sessions: the same per line, a session taking its highest line, plus the n-gram rule: the
share of a session's n-grams of templates never seen in the baseline's sessions.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from logstream.text.normalize import Normalizer
from logstream.text.patterns import PatternMiner

RARITY = 1e-3
NGRAM = 6
_RANKED = (
    (3, re.compile(r"\b(?:fatal|panic|crit(?:ical)?|emerg(?:ency)?)\b", re.IGNORECASE)),
    (2, re.compile(r"\b(?:err(?:or)?s?|fail(?:ed|s|ure)?|exceptions?)\b", re.IGNORECASE)),
    (1, re.compile(r"\bwarn(?:ing)?s?\b", re.IGNORECASE)),
)


def severity_rank(line: str) -> int:
    """3 fatal/panic/critical, 2 error/fail/exception, 1 warn, 0 none."""
    return next((rank for rank, regex in _RANKED if regex.search(line)), 0)


def online_rarity(baseline: Sequence[str], scored: Sequence[str]) -> np.ndarray:
    """-log10 of each scored line's template share among all lines so far (the baseline first)."""
    normalizer, miner, seen = Normalizer(), PatternMiner(), Counter()
    out = []
    for i, line in enumerate([*baseline, *scored], start=1):
        template = miner.add(normalizer.mask(line)).template_id
        seen[template] += 1
        if i > len(baseline):
            out.append(-math.log10(seen[template] / i))
    return np.array(out)


def line_peers(baseline: Sequence[str], scored: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (scores, flagged) over `scored`."""
    rank = np.array([severity_rank(line) for line in scored], dtype=float)
    rarity = online_rarity(baseline, scored)
    return {
        "severity": (rank, rank >= 2),
        "rarity": (rarity, rarity > -math.log10(RARITY)),
        "severity then rarity": (
            rank * 100 + np.minimum(rarity, 99.0),
            (rank >= 2) & (rarity > -math.log10(math.sqrt(RARITY))),
        ),
    }


def session_peers(
    baseline: Sequence[Sequence[str]], scored: Sequence[Sequence[str]], n: int = NGRAM
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (scores, flagged) over the `scored` sessions, their lines templates or events."""
    known = {tuple(s[i : i + n]) for s in baseline for i in range(max(1, len(s) - n + 1))}
    counts = Counter(line for s in baseline for line in s)
    total = sum(counts.values())

    def unseen_share(s: Sequence[str]) -> float:
        grams = [tuple(s[i : i + n]) for i in range(max(1, len(s) - n + 1))]
        return sum(g not in known for g in grams) / len(grams)

    ngram = np.array([unseen_share(s) for s in scored])
    rarity = np.array(
        [max((-math.log10((counts[x] + 1) / (total + 1)) for x in s), default=0.0) for s in scored]
    )
    rank = np.array([max((severity_rank(x) for x in s), default=0) for s in scored], dtype=float)
    return {
        "severity": (rank, rank >= 2),
        "rarity": (rarity, rarity > -math.log10(1 / (total + 1))),
        "severity then rarity": (
            rank * 100 + rarity,
            (rank >= 2) & (rarity > -math.log10(math.sqrt(RARITY))),
        ),
        f"unseen {n}-grams": (ngram, ngram > 0),
    }
