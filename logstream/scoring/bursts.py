"""Bursts: a template written far more often in a stream's last lines than in the lines before.

A storm of accepted connections, a flood of failed logins, a restart loop: each line of it may
be ordinary, and the model, which reads the stream's recent lines, finds the tenth copy less
surprising than the first. What is unusual is how many there are. Of a line's template, with
`k` of the stream's last `window` lines and `n` of its last `HORIZON` (the window included):
if the template came at a steady rate, the window's share of its `n` lines would be
Binomial(n, window / HORIZON), and the burst evidence is `-log10 P(Binomial(n, window /
HORIZON) >= k)`. A template new to the stream that comes k times in the window scores
`k * log10(HORIZON / window)`: rarity, and rate, in one number. The statistic is read only
once a stream has written a whole horizon, so it means the same in every stream and at
every hour. Its tail is fitted on held-out lines (`Calibration.burst`), and the horizon fits
twice in the smallest held-out sample (`train.MIN_HELDOUT_LINES`); a baseline of many hosts,
each holding out fewer lines than a horizon, counts each host's held-out tail after the lines
that host wrote in training (`train.lines_before`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Hashable, Iterable

HORIZON = 128  # lines of history the window is compared with


def binomial_tail(k: int, n: int, p: float) -> float:
    """-log10 P(Binomial(n, p) >= k)."""
    if k <= 0 or p >= 1.0:
        return 0.0
    if k > n:
        return math.inf
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    terms: list[float] = []
    for j in range(k, n + 1):
        terms.append(base - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * log_p + (n - j) * log_q)
        if j > n * p and terms[-1] < terms[0] - 40:  # past the mode, the rest add under e**-40
            break
    top = max(terms)
    log_sf = top + math.log(math.fsum(math.exp(t - top) for t in terms))
    return max(0.0, -log_sf / math.log(10))


class BurstCounter:
    """One stream's template counts over its last `window` and `HORIZON` lines."""

    def __init__(self, window: int, horizon: int = HORIZON) -> None:
        self.window, self.horizon = window, horizon
        self.recent: deque[Hashable] = deque()
        self.history: deque[Hashable] = deque()
        self.in_window: Counter[Hashable] = Counter()
        self.in_history: Counter[Hashable] = Counter()

    def observe(self, template: Hashable) -> float | None:
        """Count the line's template; its burst evidence (`binomial_tail`; None until the stream
        has written a whole horizon: before, the statistic would mean another thing)."""
        for lines, counts, size in (
            (self.recent, self.in_window, self.window),
            (self.history, self.in_history, self.horizon),
        ):
            lines.append(template)
            counts[template] += 1
            if len(lines) > size:
                counts[lines.popleft()] -= 1
        if len(self.history) < self.horizon:
            return None
        return binomial_tail(self.in_window[template], self.in_history[template], self.window / self.horizon)


def burst_evidence(
    templates: Iterable[Hashable], window: int, before: Iterable[Hashable] = ()
) -> list[float | None]:
    """Each line's burst evidence in one stream, in order; `before`: the templates of the lines
    the stream wrote before these, which count but are not scored."""
    counter = BurstCounter(window)
    for t in before:
        counter.observe(t)
    return [counter.observe(t) for t in templates]
