"""Calibrated tail scores: raw score -> -log10 P(a normal line scores at least this high).

One unit for every model, chunk and stream: a score of 4 means "a normal line scores
this high once in 10,000 lines", whatever model produced the raw number. A target
false-alarm rate q is then the same threshold everywhere: -log10 q.

Peaks over threshold (Pickands-Balkema-de Haan; SPOT, Siffer et al. KDD 2017): above a
high quantile u of the held-out normal scores (the top PEAK_SHARE of them; 20%, not
SPOT's 2%, so that a few percent of incidents are less than half the peaks), the excesses
x - u follow a generalized Pareto distribution GPD(sigma, xi), so

    P(X > x) = (n_u / n) * (1 + xi * (x - u) / sigma) ** (-1 / xi)       x >= u
    P(X > x) = empirical share of held-out scores >= x                   x <  u

The fit has two stages, so that a baseline whose held-out part holds incidents still
gets the tail of its *normal* lines (a plain fit would stretch the tail over the
incidents and hide every later one like them):
1. outward testing, as Rosner's generalized ESD test, finds the far-out peaks: the most
   top peaks, at most half, whose smallest is implausible (tail probability below
   OUTLIER_RATE / n) under an exponential tail fitted to the other peaks. They are dropped
   as outliers if they are a few incidents: at most 0.5% of the sample in lines, since
   more far-out scores than that are rare normal lines (dropping them flagged every rare
   normal line of a Thunderbird log; `max_outlier_share`: the session tail allows 5%, a
   held-out session being a whole incident, and a baseline with a few percent of incidents
   has that share of them). Given each line's template (`events`), a *burst*, a template
   with two or more held-out lines that are all far out, is one incident however many
   lines it wrote, and bursts have a cap of their own, MAX_BURST_SHARE of the sample:
   held-out lines are the baseline's last ones, which the model never trained on, so an
   alert burst there is novel to it. Far-out lines of many templates (a boot), or of a
   template that also has normal-looking lines, stay rare normal lines.;
2. probability-weighted moments (Hosking & Wallis 1987) fit the GPD to the rest; peaks
   that this fit finds plausible come back and the fit repeats, so a genuinely heavy
   tail is kept while far-out incidents stay out;
3. a fit that claims more than 5/(n+1) of the mass beyond its own largest sample (a few
   hundred bimodal samples can make the moments do that) is rescaled so that the largest
   sample sits at 1/(n+1).
xi is clamped to [0, XI_MAX]: an exponential or heavier tail, never a bounded one. A bounded
tail (xi < 0) ends a little past the largest sample, so every line beyond it scored the same
cap and the alert count jumped from a handful to a hundred between two adjacent rates; an
exponential tail keeps the score rising with the evidence, so adjacent rates move the count
gradually, and a score far past the threshold means a line far past every normal one.

`OnlineTail` refits as normal traffic drifts (DSPOT-style): the calibration sample
plus the most recent scores that were *not* flagged; a flagged line never moves it. With
those refits off (`refit_every` 0), it still refits on the lines of templates an operator
marked normal: a verdict moves calibration either way. A
refit's shape is never heavier than the calibration's: the scale and the peak threshold
follow the recent lines, but a few hundred of them mixing common lines with a new period's
rare ones fit shapes far apart, and a heavier one extrapolates a 3e-4 threshold far past
any line, silencing the detector.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

PEAK_SHARE = 0.2  # the top 20% of held-out scores are the peaks
OUTLIER_RATE = 0.1  # stage 1 drops peaks rarer than 0.1 / n under the robust exponential tail
MAX_OUTLIER_SHARE = 0.005  # ... but never more than 0.5% of the sample
MAX_BURST_SHARE = 0.05  # ... and at most 5% of it in bursts, each counted once
ANCHOR_SLACK = 5.0  # a fit may claim up to 5/(n+1) beyond its largest sample
MIN_PEAKS = 10
MIN_SAMPLES = 20
XI_MIN, XI_MAX = 0.0, 0.5
BODY_POINTS = 64  # quantiles kept to interpolate the empirical part below u
REFERENCE_SIZE = 2000  # calibration scores kept in the model directory for online refits
# Without refits of unflagged lines, a refit after every 50 lines of templates marked normal: a
# verdict moves the tail within minutes of traffic, and a fit costs about a millisecond
VERDICT_REFIT = 50


@dataclass(frozen=True)
class TailFit:
    """A fitted tail: `log10_sf(x)` is log10 P(normal score >= x)."""

    u: float  # peak threshold
    peak_share: float  # n_u / n
    sigma: float
    xi: float
    body: tuple[float, ...]  # scores at the survival probabilities `_body_survival(peak_share)`
    samples: int
    outliers: int = 0  # how many of the largest samples the fit dropped as incidents

    @cached_property
    def _body_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(body scores, their survival probabilities), built once: every line below u reads them."""
        return np.asarray(self.body), _body_survival(self.peak_share)

    def log10_sf(self, x: float) -> float:
        """log10 P(normal score >= x)."""
        if x >= self.u:
            log_sf = gpd_log_sf_one(x - self.u, self.sigma, self.xi)
            return math.log10(self.peak_share) + log_sf / math.log(10)
        body, survival = self._body_curve
        # np.interp needs increasing x: body scores rise as survival falls
        return math.log10(float(np.interp(x, body, survival, left=1.0)))

    def score(self, x: float) -> float:
        """-log10 p: how many orders of magnitude rarer than 1 in 1 a normal line this high is."""
        return max(0.0, -self.log10_sf(x))

    def raw_threshold(self, false_alarm_rate: float) -> float:
        """The raw score whose tail probability is `false_alarm_rate`."""
        if false_alarm_rate >= self.peak_share:
            body, survival = self._body_curve
            return float(np.interp(false_alarm_rate, survival[::-1], body[::-1]))
        ratio = false_alarm_rate / self.peak_share
        if self.xi == 0:
            return self.u - self.sigma * math.log(ratio)
        return self.u + self.sigma / self.xi * (ratio ** (-self.xi) - 1)

    def to_json(self) -> dict:
        return asdict(self) | {"body": [round(b, 6) for b in self.body]}

    @classmethod
    def from_json(cls, data: dict) -> TailFit:
        """A saved fit; raises ValueError/TypeError naming the first bad field."""
        fit = cls(
            u=finite(data["u"], "u"),
            peak_share=finite(data["peak_share"], "peak_share"),
            sigma=finite(data["sigma"], "sigma"),
            xi=finite(data["xi"], "xi"),
            body=tuple(finite(b, "body") for b in data["body"]),
            samples=count(data["samples"], "samples"),
            outliers=count(data["outliers"], "outliers"),
        )
        if not 0 < fit.peak_share <= 1 or fit.sigma <= 0 or not XI_MIN <= fit.xi <= XI_MAX:
            raise ValueError(
                f"tail fit out of range: peak_share {fit.peak_share}, sigma {fit.sigma}, xi {fit.xi}"
            )
        if len(fit.body) != BODY_POINTS or list(fit.body) != sorted(fit.body):
            raise ValueError(f"tail fit body: expected {BODY_POINTS} ascending scores")
        return fit


def count(value: object, name: str) -> int:
    """A non-negative integer, or ValueError/TypeError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}: {value} is negative")
    return value


def finite_list(values: object, name: str) -> list[float]:
    """A list of finite floats, or ValueError/TypeError naming `name`."""
    if not isinstance(values, list):
        raise TypeError(f"{name}: expected a list of numbers, got {type(values).__name__}")
    return [finite(v, name) for v in values]


def finite(value: object, name: str) -> float:
    """A finite number as a float, or ValueError/TypeError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: {value} is not finite")
    return float(value)


def gpd_log_sf(excess: np.ndarray, sigma: float, xi: float) -> np.ndarray:
    """ln P(excess > e) under GPD(sigma, xi >= 0), elementwise."""
    z = excess / sigma
    return -z if xi == 0 else -np.log1p(xi * z) / xi


def gpd_log_sf_one(excess: float, sigma: float, xi: float) -> float:
    """`gpd_log_sf` of one excess, without numpy's overhead (scoring calls it once per line)."""
    z = excess / sigma
    return -z if xi == 0 else -math.log1p(xi * z) / xi


def _body_survival(peak_share: float) -> np.ndarray:
    return np.linspace(1.0, peak_share, BODY_POINTS)


def _pwm_gpd(excess: np.ndarray, xi_max: float = XI_MAX) -> tuple[float, float]:
    """(sigma, xi) of a GPD fitted to sorted excesses by probability-weighted moments, xi
    clamped to [XI_MIN, xi_max]."""
    m = len(excess)
    a0 = float(excess.mean())
    a1 = float(np.mean((1 - (np.arange(1, m + 1) - 0.35) / m) * excess))
    if a0 > 0 and a0 - 2 * a1 > 0:
        xi = 2 - a0 / (a0 - 2 * a1)  # Hosking's shape k is -xi
        sigma = 2 * a0 * a1 / (a0 - 2 * a1)
    else:  # every peak ties, or a tail too heavy for the moments: exponential, clamped below
        xi, sigma = 0.0, max(a0, 1e-9)
    if abs(xi) < 1e-6 or xi > xi_max or xi < XI_MIN:
        xi = min(max(xi, XI_MIN), xi_max) if abs(xi) >= 1e-6 else min(0.0, xi_max)
        # refit sigma for the clamped shape: the GPD's mean excess is sigma / (1 - xi)
        sigma = max(a0, 1e-9) * (1 - xi)
    return sigma, xi


def fit_tail(
    scores: np.ndarray | list[float],
    max_outlier_share: float = MAX_OUTLIER_SHARE,
    xi_max: float = XI_MAX,
    events: Sequence[Hashable | None] | None = None,
    censored: int = 0,
) -> TailFit:
    """Fit the tail of held-out normal scores; raises ValueError with too few of them.
    At most `max_outlier_share` of the sample is ever dropped as incidents (stage 1).
    `xi_max`: the heaviest shape allowed (an online refit's: the calibration's).
    `events`: per score, the event it belongs to (a line's template; None: a line of its
    own). An event with two or more scores, all far out, is a burst: one incident, capped at
    MAX_BURST_SHARE of the sample, where as many far-out lines of as many templates, or of a
    template whose other lines are normal, are rare normal ones. `censored`: how many more
    scores lie above every one given and were left out (an online refit's flagged lines)."""
    x = np.asarray(scores, dtype=float)
    order = np.argsort(x, kind="stable")
    order = order[np.isfinite(x[order])]
    x = x[order]
    n = len(x)
    if n < MIN_SAMPLES:
        raise ValueError(f"calibration: {n} held-out scores; at least {MIN_SAMPLES} are needed")
    n_peaks = min(n - 1, max(MIN_PEAKS, int(n * PEAK_SHARE)))
    u = float(x[n - n_peaks - 1])
    excess = x[n - n_peaks :] - u  # sorted
    # stage 1: the far-out peaks under a robust exponential tail (`far_out_peaks`)
    n_far, robust_sigma = far_out_peaks(excess, floor=1e-6 * max(1.0, abs(u)))
    plausible = np.arange(n_peaks) < n_peaks - n_far
    lines_of = Counter(events[i] for i in order) if events is not None else Counter()

    def too_many(dropped: int) -> bool:  # the top `dropped` scores: more than a few incidents?
        top = Counter(events[i] for i in order[n - dropped :]) if events is not None else Counter()
        # a burst is one incident; other far-out lines count one by one
        bursts = [e for e, k in top.items() if e is not None and k >= 2 and k == lines_of[e]]
        lines = dropped - sum(top[e] for e in bursts)
        return lines > max_outlier_share * n or len(bursts) > MAX_BURST_SHARE * n

    if too_many(int(n_peaks - plausible.sum())):
        plausible[:] = True  # that many far-out scores are rare normal lines, not a few incidents
    # stage 2, repeated until stable: fit the kept peaks; peaks the fitted GPD finds plausible
    # come back (a heavy tail is data, not noise), the rest stay out (incidents stay implausible)
    for _ in range(8):
        n_kept = int(plausible.sum())
        sigma, xi = _pwm_gpd(excess[plausible], xi_max) if n_kept >= MIN_PEAKS else (robust_sigma, 0.0)
        again = gpd_log_sf(excess, sigma, xi) >= math.log(OUTLIER_RATE / n_peaks)
        if np.array_equal(again, plausible) or too_many(int(n_peaks - again.sum())):
            break
        plausible = again
    normal = x[: n - n_peaks + n_kept]  # excess is sorted: the outliers are the top peaks
    peak_share = n_kept / len(normal)
    sigma = _anchor_at_maximum(sigma, xi, float(excess[n_kept - 1]), peak_share, len(normal), censored)
    body = np.quantile(normal, 1.0 - _body_survival(peak_share))
    return TailFit(
        u=u, peak_share=peak_share, sigma=sigma, xi=xi, body=tuple(map(float, body)), samples=n,
        outliers=n_peaks - n_kept,
    )  # fmt: skip


def far_out_peaks(excess: np.ndarray, floor: float) -> tuple[int, float]:
    """(k, sigma): how many of the largest excesses are far out, and the exponential scale
    of the rest. Outward testing, as Rosner's generalized ESD: k is the largest count, at
    most half of the positive excesses, such that the smallest of the top k lies beyond
    sigma * ln(m / OUTLIER_RATE), sigma being the mean of the others (the exponential's
    maximum-likelihood scale). Testing from half the peaks down finds incidents however many
    of them hide each other (a trimmed mean of a fixed share took them into the scale once
    they passed its trim), and a plateau of tied normal scores sets the scale by its own
    mean. Excesses of 0 (ties at u) are left out, as they would shrink every scale to
    nothing, unless fewer than MIN_PEAKS are above them: then the tie is the tail, and a few
    scores above a tie of nearly all the peaks are far out (HDFS's held-out sessions without
    sinks: 97 of 101 peaks tie, and the 4 above are the incident sessions)."""
    m = len(excess)
    positive = excess[excess > 0]  # sorted, as excess is
    values = positive if len(positive) >= MIN_PEAKS else excess  # mostly ties at u: those are the tail
    p = len(values)
    scale = np.maximum(np.cumsum(values) / np.arange(1, p + 1), floor)  # [r - 1]: mean of the lowest r
    k = np.arange(1, p // 2 + 1)
    far = values[p - k] > scale[p - k - 1] * math.log(m / OUTLIER_RATE)
    n_far = int(k[far].max()) if far.any() else 0
    return n_far, float(scale[p - n_far - 1])


def _anchor_at_maximum(
    sigma: float, xi: float, top_excess: float, peak_share: float, n: int, censored: int = 0
) -> float:
    """Keep the fit honest about its own largest sample, whose survival is about 1/(n+1).

    With a few hundred bimodal samples (many plain lines, a hump of rare ones) the moments
    can put several percent of the mass beyond the largest sample and so a 1e-3 threshold
    far past anything seen. When the fit claims more than ANCHOR_SLACK times 1/(n+1) there,
    sigma is rescaled (xi kept) so that the largest sample sits at 1/(n+1).
    With `censored` scores known to lie above it (an online refit's flagged lines, left out
    of its sample) the largest sample's survival is (1 + censored) / (n + censored + 1):
    anchored at 1/(n+1), a refit's sample, cut at the threshold, pulled the threshold down
    to that cut, refit after refit (so a refit never drifts the threshold down).
    """
    if top_excess <= 0:
        return sigma
    target = (1 + censored) / (n + censored + 1) / peak_share  # survival within the peaks
    fitted = math.exp(gpd_log_sf_one(top_excess, sigma, xi))
    if fitted <= ANCHOR_SLACK * target or target >= 1:
        return sigma
    z_target = -math.log(target) if xi == 0 else (target ** (-xi) - 1) / xi
    return top_excess / z_target


def reference_sample(scores: list[float], size: int = REFERENCE_SIZE) -> list[float]:
    """At most `size` scores spread evenly over the sorted sample: kept for online refits."""
    x = np.sort(np.asarray(scores, dtype=float))
    if len(x) > size:
        x = x[np.linspace(0, len(x) - 1, size).round().astype(int)]
    return [round(float(v), 5) for v in x]


class OnlineTail:
    """DSPOT-style refits: the calibration sample plus the latest unflagged scores.

    `observe` takes one raw score and whether it was flagged, line by line, so a refit
    takes effect from the next line on, however the lines were batched (replay and serve
    batch differently); every `refit_every` unflagged scores the tail is fitted again.
    Flagged scores are never added, so an incident cannot teach the threshold to accept it.
    But the recent sample is cut at the threshold, so some flagged lines count as scores
    above every kept one (`fit_tail(censored=...)`): as many as the flagging rate (`observe`'s
    `rate`) expects of normal lines over the recent span, at most; the others are incidents.
    Refits take the calibration's shape as the heaviest allowed (`fit_tail(xi_max=...)`).
    """

    def __init__(self, fit: TailFit, reference: list[float], refit_every: int = 500) -> None:
        self.fit = fit
        self._xi_max = fit.xi
        self._reference = list(reference)
        self._recent: deque[float] = deque(maxlen=max(len(reference), 1000))
        # per recent score, the flagged lines just before it: those within the recent span
        self._flagged_before: deque[int] = deque(maxlen=self._recent.maxlen)
        self._flagged_since = 0  # flagged lines since the last recent score
        self._refit_every = refit_every
        self._since_refit = 0

    def observe(self, raw: float, flagged: bool, rate: float = 0.0, normal: bool = False) -> None:
        """One line's raw score; `flagged` if it alerted, at `rate`, the share of normal lines
        the threshold flags (10 ** -threshold); `normal` if an operator marked its template
        normal. Without refits of unflagged lines (`refit_every` 0) the tail still learns the
        lines operators vouched for, refitted every VERDICT_REFIT of them."""
        if not self._reference or not math.isfinite(raw) or (self._refit_every <= 0 and not normal):
            return
        if flagged:
            self._flagged_since += 1
            return
        self._recent.append(raw)
        self._flagged_before.append(self._flagged_since)
        self._flagged_since = 0
        self._since_refit += 1
        if self._since_refit >= (self._refit_every if self._refit_every > 0 else VERDICT_REFIT):
            flagged_lines = sum(self._flagged_before)
            censored = min(flagged_lines, round(rate * (len(self._recent) + flagged_lines)))
            self.fit = fit_tail([*self._reference, *self._recent], xi_max=self._xi_max, censored=censored)
            self._since_refit = 0
