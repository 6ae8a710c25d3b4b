"""Bursts: a template written far more often in a stream's last lines than in the lines before.

A storm of accepted connections, a flood of failed logins, a restart loop: each line of it may
be ordinary, and the model, which reads the stream's recent lines, finds the tenth copy less
surprising than the first. What is unusual is how many there are. The line itself is always
the newest of the window, so it is not evidence of its own burst: of its template's *other*
lines, with `k` of the stream's `window - 1` lines before it and `n` of its last `HORIZON - 1`
(the window's included), a steady rate would put Binomial(n, (window - 1) / (HORIZON - 1)) of
them in the window, and the burst evidence is `-log10 P(Binomial >= k)`: on a steady stream, a
p-value. A line whose template has no other line in the window has no burst to test (None):
its words alone score it, where a test that cannot reject (p = 1) would only cost its words
the price of combining (`calibration.fisher`). A template new to the stream that comes k
times in a row scores about `(k - 1) * log10(HORIZON / window)` at its k-th line. The
statistic is read only once a stream has written a whole horizon, so it means the same in
every stream and at every hour. Its tail is fitted on the held-out lines that have some
(`Calibration.burst`), and the horizon fits twice in the smallest held-out sample
(`train.MIN_HELDOUT_LINES`); a baseline of many hosts, each holding out fewer lines than a
horizon, counts each host's held-out tail after the lines that host wrote in training
(`train.lines_before`).
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
        """Count the line's template; its burst evidence (`binomial_tail`). None until the stream
        has written a whole horizon (before, the statistic would mean another thing), and when
        no other line of the template is in the window (no burst to test)."""
        for lines, counts, size in (
            (self.recent, self.in_window, self.window),
            (self.history, self.in_history, self.horizon),
        ):
            lines.append(template)
            counts[template] += 1
            if len(lines) > size:
                counts[lines.popleft()] -= 1
        if len(self.history) < self.horizon or self.in_window[template] == 1:
            return None
        others = (self.window - 1) / (self.horizon - 1)  # the share of the other lines in the window
        return binomial_tail(self.in_window[template] - 1, self.in_history[template] - 1, others)


def burst_evidence(
    templates: Iterable[Hashable], window: int, before: Iterable[Hashable] = ()
) -> list[float | None]:
    """Each line's burst evidence in one stream, in order; `before`: the templates of the lines
    the stream wrote before these, which count but are not scored."""
    counter = BurstCounter(window)
    for t in before:
        counter.observe(t)
    return [counter.observe(t) for t in templates]
