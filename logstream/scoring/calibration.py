"""Calibration: a line's surprisal in the one unit of every score, plus its level's prior.

    score = -log10 P(a normal line's surprisal >= this line's) + prior(level)

The first term is the tail of held-out baseline lines' surprisal (`tail.fit_tail`: peaks over
threshold, no labels), refitted online on lines that did not alert: a score of 4 says "a
normal line is this surprising once in 10,000 lines", for any model, chunk or stream. The
second is the line's level as a probability factor (`ScoringConfig.level_prior`: an error
line counts 10x as likely to matter). It is added after the tail, on purpose: a baseline
full of recurring failures teaches the model those lines, and the tail would then call them
ordinary; the prior is an axis that neither training nor calibration can learn away.

A line's template can also come in a burst (`bursts`: far more often in the stream's last
lines than before), which its words alone do not show. The burst evidence has its own tail,
fitted on the held-out lines too (those past a stream's first horizon, which have a rate to
compare with, whose template came in the window before; a held-out tail shorter than a horizon
counts after its stream's last training lines, `train.lines_before`), and never past the
evidence itself, a p-value at a steady rate. The words have a peer in the template's rarity
among all the lines the model has read (`rarity`, a p-value with no tail): a storm's tenth
line, which the model finds ordinary because its window holds the first nine, is still rare
in the system's history. Both say how new the line is, so the stronger counts, at twice its
p-value (`novelty`). The novelty and the burst combine as independent tests
(Fisher's product of p-values): with s the sum of both, the line's p is 10**-s (1 + s ln 10),
the chance that two uniform p-values multiply to that little. One strong piece of evidence
still alerts, two moderate ones alert together, and a normal line alerts no more often than
the rate says. A model saved without the burst tail scores its words alone.

Alerts fire above -log10 of the false-alarm rate. For a line without a level the rate is
what it says; a level's line alerts 10 ** prior times as readily. An alert is critical
when its score passes the threshold by CRITICAL_MARGIN orders of magnitude: a line
100 times rarer than what alerts (`alert_severity`). Severity is the line's own, its words and
level: a burst of ordinary lines alerts as a warning, however long it runs
(`ScoredLine.severity`).

Stream ends score the end-of-stream token's NLL against its own tail. A session's score is
its most surprising *stretch*, at every length (a scan statistic): for w = 1, 2, 4, ... lines,
the session's highest mean line score over w consecutive lines (w = 1: its worst line, or its
end), each against the tail of held-out sessions' same-length highs; the session takes the
highest, less log10 of the number of lengths tested (each length is one more chance for a
normal session to look far out). The worst line alone misses a short run of lines that are
each a little unusual (a process trace's injected calls) and a mean over the whole session
dilutes it by the session's length; a stretch of its own length does neither. Lengths go up
while MIN_SAMPLES held-out sessions are that long, so the data sets them, not a constant.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from logstream.errors import UserError
from logstream.scoring.bursts import burst_evidence
from logstream.scoring.config import ScoringConfig
from logstream.scoring.gpd import (
    MAX_OUTLIER_SHARE,
    MIN_SAMPLES,
    TailFit,
    count,
    finite_list,
    fit_tail,
    reference_sample,
)

CRITICAL_MARGIN = 2.0  # orders of magnitude past the threshold that make an alert critical
# A session is a whole incident: a baseline "with a few percent of incidents" has a few percent
# of its sessions far out, so the session tail may drop up to 5% of them (lines: 0.5%)
SESSION_OUTLIER_SHARE = 0.05


@dataclass
class Calibration:
    """The tails of held-out baseline scores (no labels), and the scoring config they hold for."""

    config: ScoringConfig = field(default_factory=ScoringConfig)
    line: TailFit | None = None  # of the lines' surprisal, nats
    end: TailFit | None = None  # of the end-of-stream NLL, when the model learned stream ends
    session: TailFit | None = None  # of the held-out sessions' worst scores
    burst: TailFit | None = None  # of the held-out lines' burst evidence (`bursts`)
    stretches: list[TailFit] = field(default_factory=list)  # of their highest 2, 4, 8, ... line means
    line_reference: list[float] = field(default_factory=list)  # sorted held-out samples
    burst_reference: list[float] = field(default_factory=list)
    end_reference: list[float] = field(default_factory=list)
    session_reference: list[float] = field(default_factory=list)
    heldout_lines: int = 0
    heldout_sessions: int = 0

    def threshold(self, false_alarm_rate: float | None = None) -> float:
        """The score threshold for a false-alarm rate (default: the config's)."""
        return -math.log10(false_alarm_rate or self.config.false_alarm_rate)

    def line_score(
        self, surprisal: float, level: str | None, fit: TailFit | None = None, burst: float | None = None
    ) -> float:
        """The calibrated surprisal (`fit`: an online refit of the line tail), combined with the
        calibrated burst evidence when the line has some and the model its tail, plus the
        level's prior (a line with a rarity too: `line_scores`)."""
        return self.line_scores(surprisal, level, fit, burst)[0]

    def line_scores(
        self,
        surprisal: float,
        level: str | None,
        fit: TailFit | None = None,
        burst: float | None = None,
        rarity: float | None = None,
    ) -> tuple[float, float, float | None]:
        """(`line_score`, the words' score alone: the calibrated surprisal plus the prior, the
        calibrated burst evidence: None when the line has none or the model no burst tail).
        With its template's `rarity`, the stronger of it and the words counts (`novelty`)."""
        tail = fit or self.line
        words = tail.score(surprisal) if tail is not None else surprisal
        new = novelty(words, rarity)
        prior = self.config.prior(level)
        if self.burst is None or burst is None:
            return new + prior, words + prior, None
        rate = self.burst_score(burst)
        return fisher(new, rate) + prior, words + prior, rate

    def burst_score(self, evidence: float) -> float:
        """The burst tail's score, but never past the share of held-out lines with at least this
        evidence: the evidence is discrete (a count in a window), and a step that many normal
        lines share is as common as their share says, where a continuous tail fitted over such
        steps can put it orders of magnitude out. Nor past the evidence itself, the burst's
        p-value at a steady rate: normal lines come at least as bursty as that, and a tail that
        says otherwise extrapolates from a few hundred held-out lines."""
        rate = self.burst.score(evidence) if self.burst is not None else 0.0
        reference = self.burst_reference
        if reference and evidence <= reference[-1]:
            # the reference is stored to 5 places (`reference_sample`): compare at that precision
            share = (len(reference) - bisect.bisect_left(reference, round(evidence, 5))) / len(reference)
            rate = min(rate, -math.log10(share))
        return min(rate, evidence)

    def end_score(self, nll: float) -> float:
        """A stream end's tail score; 0 (no evidence) without an end tail: raw NLL is not a score."""
        return self.end.score(nll) if self.end is not None else 0.0

    def session_score(self, line_scores: Sequence[float], end_score: float | None) -> float:
        """The tail score of the session's most surprising stretch of lines (the module doc)."""
        worst = session_worst(line_scores, end_score)
        if self.session is None:
            return worst
        highs = stretch_highs(line_scores, len(self.stretches))
        scores = [
            self.session.score(worst),
            *(fit.score(x) for fit, x in zip(self.stretches, highs, strict=False)),
        ]
        return max(scores) - math.log10(1 + len(self.stretches))

    @property
    def learned_stream_ends(self) -> bool:
        return self.end is not None

    def to_json(self) -> dict:
        out = asdict(self)
        for name in FITS:
            fit = getattr(self, name)
            out[name] = fit.to_json() if fit is not None else None
        out["stretches"] = [fit.to_json() for fit in self.stretches]
        return out

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        """A saved calibration; raises ValueError/TypeError/KeyError on bad content."""
        unknown = set(data) - {*FITS, *REFERENCES, *COUNTS, "config", "stretches"}
        if unknown:
            raise ValueError(f"unknown calibration fields: {sorted(unknown)}")
        fits = {name: TailFit.from_json(data[name]) if data.get(name) else None for name in FITS}
        stretches = data.get("stretches", [])  # a model saved without them scores worst lines
        if not isinstance(stretches, list):
            raise TypeError(f"stretches: expected a list, got {type(stretches).__name__}")
        references = {name: sorted(finite_list(data.get(name, []), name)) for name in REFERENCES}
        counts = {name: count(data[name], name) for name in COUNTS}
        config = data["config"]
        if not isinstance(config, dict):
            raise TypeError(f"config: expected a mapping, got {type(config).__name__}")
        return cls(
            config=ScoringConfig(**config), stretches=[TailFit.from_json(x) for x in stretches],
            **fits, **references, **counts,
        )  # fmt: skip


FITS = ("line", "end", "session", "burst")
REFERENCES = ("line_reference", "end_reference", "session_reference", "burst_reference")
COUNTS = ("heldout_lines", "heldout_sessions")


def novelty(words: float, rarity: float | None) -> float:
    """How new the line is: its words' score, or its template's rarity among the lines so far
    when that is stronger (`rarity`: None without it). Both ask whether the line is new, one
    of the model and one of the system's history, so the stronger is taken at the price of
    asking twice (Bonferroni: -log10 of twice its p, never past p = 1)."""
    if rarity is None:
        return words
    return max(max(words, rarity) - math.log10(2), 0.0)


def fisher(a: float, b: float) -> float:
    """Two independent tail scores (-log10 p) as one: -log10 P(U1 * U2 <= 10**-(a + b))."""
    total = a + b
    return total - math.log10(1 + total * math.log(10))


def alert_severity(score: float, threshold: float) -> str:
    """ "critical" for a score CRITICAL_MARGIN orders of magnitude past the threshold, else "warning"."""
    return "critical" if score >= threshold + CRITICAL_MARGIN else "warning"


def session_worst(line_scores: Sequence[float], end_score: float | None) -> float:
    return max([*line_scores, *([end_score] if end_score is not None else [])], default=0.0)


def stretch_highs(line_scores: Sequence[float], lengths: int) -> list[float]:
    """The highest mean score over 2, 4, 8, ... consecutive lines, for `lengths` lengths; a
    session shorter than a length has no stretch of it and stops the list there."""
    sums = np.concatenate([[0.0], np.cumsum(np.asarray(line_scores, dtype=float))])
    out = []
    for k in range(1, lengths + 1):
        w = 2**k
        if len(sums) - 1 < w:
            break
        out.append(float((sums[w:] - sums[:-w]).max() / w))
    return out


def _fit(
    samples: list[float],
    max_outlier_share: float = MAX_OUTLIER_SHARE,
    events: list[int | None] | None = None,
) -> tuple[TailFit | None, list[float]]:
    """A tail and its reference sample for online refits, or (None, []) with too few samples.
    Outliers dropped as bursts (more lines than the line cap allows: `fit_tail(events=...)`)
    stay out of the reference: a refit has only the scores, so it would count their lines and
    take them back."""
    if len(samples) < MIN_SAMPLES:
        return None, []
    fit = fit_tail(samples, max_outlier_share, events=events)
    if fit.outliers > max_outlier_share * fit.samples:
        samples = sorted(v for v in samples if math.isfinite(v))[: fit.samples - fit.outliers]
    return fit, reference_sample(samples)


def fit_calibration(
    config: ScoringConfig, surprisal: list[float], templates: list[int | None], end_nll: list[float]
) -> Calibration:
    """The line tail from held-out lines' surprisal (`templates`: each line's, so a burst counts
    as one incident) and the end tail from held-out stream ends' NLL (the session tail:
    `fit_sessions`)."""
    calibration = Calibration(config=config, heldout_lines=len(surprisal))
    calibration.line, calibration.line_reference = _fit(surprisal, events=templates)
    if calibration.line is None:
        raise UserError(
            f"calibration: {len(surprisal)} held-out baseline lines; at least {MIN_SAMPLES} are needed (more baseline)"
        )
    calibration.end, calibration.end_reference = _fit(end_nll)
    return calibration


def fit_bursts(calibration: Calibration, streams: list[HeldOut]) -> None:
    """The burst tail, of held-out line streams' burst evidence (sessions have none: the
    template counts of one short session say nothing of a rate)."""
    window = calibration.config.burst_window
    evidence = [
        x
        for s in streams
        if s.end is None
        for x in burst_evidence(s.templates, window, s.before)
        if x is not None
    ]
    calibration.burst, calibration.burst_reference = _fit(evidence)


@dataclass(frozen=True)
class HeldOut:
    """What calibration needs of one held-out baseline stream, as the model scored it."""

    surprisal: list[float]  # per line, nats
    templates: list[int | None]  # per line, its template id (a burst is one incident)
    levels: list[str | None]  # per line
    end: float | None = None  # the end-of-stream token's NLL (None: the stream did not end)
    before: list[int | None] = field(default_factory=list)  # templates counted first (`train.lines_before`)


def fit_heldout(config: ScoringConfig, streams: list[HeldOut]) -> Calibration:
    """The calibration of held-out baseline streams: the line and end tails from their lines'
    surprisal and ends' NLL, and the session tails from each session's worst score and
    stretches, all less the sessions that look like whole incidents (`normal_sessions`).
    No labels."""
    normal = normal_sessions(streams)
    kept = [s for s in streams if s.end is None] + normal
    calibration = fit_calibration(
        config,
        [x for s in kept for x in s.surprisal],
        [t for s in kept for t in s.templates],
        [s.end for s in kept if s.end is not None],
    )
    fit_bursts(calibration, streams)
    fit_sessions(calibration, normal)
    return calibration


def normal_sessions(streams: list[HeldOut]) -> list[HeldOut]:
    """The held-out streams that ended (sessions), less those that look like whole incidents:
    a far-out worst line, or a far-out end (a session that stops where normal ones never do,
    as a block write that dies after its first lines: its lines are all ordinary)."""
    sessions = [s for s in streams if s.end is not None]
    incidents = incident_sessions([max(s.surprisal, default=0.0) for s in sessions])
    incidents |= incident_sessions([s.end for s in sessions if s.end is not None])
    return [s for k, s in enumerate(sessions) if k not in incidents]


def incident_sessions(evidence: list[float]) -> set[int]:
    """The held-out sessions that look like whole incidents by one piece of evidence (their
    most surprising line's surprisal, or their end's NLL): those a tail of it drops as
    outliers (at most SESSION_OUTLIER_SHARE of them). They stay out of every tail: a baseline
    with a few percent of incident sessions has more incident lines than the line tail's 0.5%
    cap can tell from rare normal lines, and they would stretch the line tail, the end tail
    and the session tails over every incident like them."""
    if len(evidence) < MIN_SAMPLES:
        return set()
    dropped = fit_tail(evidence, SESSION_OUTLIER_SHARE).outliers
    order = np.argsort(evidence, kind="stable")
    return {int(k) for k in order[len(evidence) - dropped :]}


def fit_sessions(calibration: Calibration, sessions: list[HeldOut]) -> None:
    """Fit the session tails on held-out sessions' worst line or end scores and on their
    highest stretches, as `calibration` (its line and end tails, its config's level priors)
    scores them; a length is fitted while at least MIN_SAMPLES sessions are that long."""
    lines = [
        [calibration.line_score(x, level) for x, level in zip(s.surprisal, s.levels, strict=True)]
        for s in sessions
    ]
    worst = [
        session_worst(scores, calibration.end_score(s.end) if s.end is not None else None)
        for scores, s in zip(lines, sessions, strict=True)
    ]
    calibration.session, calibration.session_reference = _fit(worst, SESSION_OUTLIER_SHARE)
    calibration.heldout_sessions = len(worst) if calibration.session else 0
    # 2 ** k lines, for each k up to log2 of the MIN_SAMPLES-th longest session
    lengths = sorted(map(len, lines))[-MIN_SAMPLES].bit_length() - 1 if len(lines) >= MIN_SAMPLES else 0
    highs = [stretch_highs(scores, lengths) for scores in lines]
    calibration.stretches = [
        fit
        for k in range(lengths)
        if (fit := _fit([h[k] for h in highs if len(h) > k], SESSION_OUTLIER_SHARE)[0]) is not None
    ]
