"""The scorer: one line's stages, in order, for every line the model has read.

1. evidence: the line's surprisal under the model (`evidence.line_surprisal`), its
   template (online Drain, seeded with the training templates: `novel` when it is new), how
   that template bursts in the line's stream (`bursts.BurstCounter`) and how rare it is among
   all the lines the model has read (`rarity.TemplateCounts`, seeded with the baseline's);
2. prior: its level, from a level field or failure words (`ScoringConfig.level`);
3. calibration: surprisal and burst -> -log10 p under their tails, the stronger of the
   surprisal's and the rarity's combined with the burst's, plus the level's prior
   (`Calibration.line_score`); the line tail is refitted online (`ScoringConfig.refit_every`);
4. operator rules: a verdict on its template (`rules.OperatorRules`). "normal": never an
   alert, and the line joins the normal sample of the online refit; "anomaly": always an
   alert, and the line stays out of it.

A line alerts over the threshold, and a line of the critical level whatever its score: a
baseline full of a failure teaches the model that failure, and frequency must never make a
failure normal (`ScoredLine.alerts`).

`Scorer.score` takes what the model computed (`Detector.token_surprisal`), so benchmarks can
run the stages again over cached model output with other constants (benchmarks/quality.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from logstream.records import LogRecord
from logstream.scoring.bursts import BurstCounter
from logstream.scoring.calibration import Calibration, alert_severity
from logstream.scoring.evidence import line_surprisal
from logstream.scoring.gpd import OnlineTail
from logstream.scoring.rarity import TemplateCounts
from logstream.scoring.rules import OperatorRules
from logstream.text.explain import Explanation
from logstream.text.patterns import MAX_TEMPLATES, seeded_miner


@dataclass(frozen=True)
class ScoredLine:
    """A line (or a stream's end, or a quiet source) with its score and what decided it."""

    record: LogRecord
    score: float  # -log10 P(a normal line is this surprising) + the level's prior
    threshold: float
    surprisal: float  # nats, the model alone (kind "end": the end token's NLL; "quiet": seconds silent)
    level: str | None = None  # from the level field or failure words
    template_id: int | None = None
    template: str | None = None
    novel: bool = False  # the line's template is new to the model
    verdict: str | None = None  # an operator's verdict on its template: "normal" | "anomaly"
    kind: str = "line"  # "line" | "end" | "quiet" (a source that stopped logging; logstream.scoring.quiet)
    burst: float = 0.0  # -log10 p of its template's burst in the stream (0 without a burst tail)
    rarity: float = 0.0  # -log10 p of its template's rarity among the lines so far (`rarity`)
    words: float | None = None  # the score without the burst evidence (None: the same as score)
    explanation: Explanation | None = None  # the surprising words (alerts only)
    top_tokens: tuple[tuple[str, float], ...] = ()  # the most surprising tokens (alerts only)

    @property
    def alerts(self) -> bool:
        """Over the threshold, or of the critical level: a failure that the model and the tail
        learned as ordinary from a baseline full of it still alerts (verdicts aside)."""
        return self.score > self.threshold or self.level == "critical"

    @property
    def is_anomaly(self) -> bool:
        if self.verdict is not None:
            return self.verdict == "anomaly"
        return self.alerts

    @property
    def suppressed(self) -> bool:
        """It would alert, but its template was marked normal."""
        return self.verdict == "normal" and self.alerts

    @property
    def severity(self) -> str:
        """The alert's severity, by the line alone (its words and level, `words`): a burst of
        ordinary lines is a warning however long it runs (`calibration.alert_severity`)."""
        return alert_severity(self.score if self.words is None else self.words, self.threshold)


class Scorer:
    """Stages 1-4 for lines whose token surprisal the model computed; see the module doc."""

    def __init__(
        self,
        calibration: Calibration,
        known_templates: Sequence[str],
        rules: OperatorRules | None = None,
        template_counts: Sequence[int] | None = None,
    ) -> None:
        """`template_counts`: the baseline's lines per known template; without them (a model
        saved before it counted) lines have no rarity evidence."""
        self.known_templates = list(known_templates)
        self.template_counts = list(template_counts) if template_counts is not None else None
        self.rules = rules
        self.calibration = calibration

    @property
    def calibration(self) -> Calibration:
        return self._calibration

    @calibration.setter
    def calibration(self, calibration: Calibration) -> None:
        """A new calibration restarts the online tail from its line tail."""
        self._calibration = calibration
        line, every = calibration.line, calibration.config.refit_every
        self.online = OnlineTail(line, calibration.line_reference, every) if line is not None else None
        self.reset()

    def reset(self) -> None:
        """Forget the templates learned since loading, the lines counted since, and every
        stream's bursts."""
        self.miner, clusters = seeded_miner(self.known_templates)
        self.known = self.miner.size  # clusters 1..known are training templates
        self.bursts: dict[str, BurstCounter] = {}
        self.counts: TemplateCounts | None = None
        # a model without a burst tail scores its words alone, with no rarity either: sessions
        # (a session is scored against other sessions) and baselines too small for the tail
        if self.template_counts is not None and self._calibration.burst is not None:
            self.counts = TemplateCounts(zip(clusters, self.template_counts, strict=True))

    def close(self, stream: str) -> None:
        """Forget a stream's bursts (its template counts)."""
        self.bursts.pop(stream, None)

    def templates(self, masked: Iterable[str]) -> list[int]:
        """The template of each masked line, as scoring mines them."""
        return [self.miner.add(text).template_id for text in masked]

    def _burst(self, stream: str, template_id: int) -> float | None:
        """The line's burst evidence in its stream; None without a burst tail (nothing reads it)."""
        if self._calibration.burst is None:
            return None
        counter = self.bursts.get(stream)
        if counter is None:
            counter = self.bursts[stream] = BurstCounter(self._calibration.config.burst_window)
        return counter.observe(template_id)

    def _rarity(self, cluster: int) -> float | None:
        """The line's rarity evidence; None without the baseline's counts (nothing reads it)."""
        if self.counts is None:
            return None
        if len(self.counts.counts) > 2 * MAX_TEMPLATES:  # the miner evicted as many as it holds
            self.counts.keep_only(self.miner.cluster_ids())
        return self.counts.observe(cluster)

    def score(
        self,
        records: Sequence[LogRecord],
        masked: Sequence[str],
        token_nll: Sequence[np.ndarray],
        word_starts: Sequence[np.ndarray | None],
        threshold: float,
    ) -> list[ScoredLine]:
        """One ScoredLine per record, in order."""
        config, calibration = self._calibration.config, self._calibration
        rate = 10**-threshold  # the share of normal lines it flags: what the online tail expects
        if self.rules is not None:
            self.rules.refresh()
        out = []
        for record, text, nll, starts in zip(records, masked, token_nll, word_starts, strict=True):
            mined = self.miner.add(text)
            surprisal = line_surprisal(nll, starts, config.line_top_k)
            level = config.level(record.line)
            fit = self.online.fit if self.online is not None else None
            rarity = self._rarity(mined.cluster)
            score, words, burst = calibration.line_scores(
                surprisal, level, fit, self._burst(record.stream, mined.template_id), rarity
            )
            verdict = self.rules.verdict(text, record.stream) if self.rules is not None else None
            line = ScoredLine(
                record, score, threshold, surprisal, level, mined.template_id, mined.template,
                novel=mined.cluster > self.known, verdict=verdict,
                burst=burst or 0.0, rarity=rarity or 0.0, words=words,
            )  # fmt: skip
            if self.online is not None and verdict != "anomaly":
                # the tail is of surprisal: a line beyond it by its surprisal alone stays out
                beyond = verdict is None and score - config.prior(level) > threshold
                self.online.observe(surprisal, beyond, rate, normal=verdict == "normal")
            out.append(line)
        return out


def end_of_stream(stream: str, nll: float, calibration: Calibration, threshold: float) -> ScoredLine:
    """A stream's end as a scored item (kind "end"): its end-of-stream token's NLL against the
    end tail. A session alert can show it: a session can be wrong only in where it stops."""
    return ScoredLine(
        record=LogRecord(line="<end of stream>", stream=stream),
        score=calibration.end_score(nll),
        threshold=threshold,
        surprisal=nll,
        kind="end",
    )


def session_evidence(lines: Sequence[ScoredLine]) -> list[float]:
    """The lines' scores as a session's evidence: a line whose template an operator marked
    normal counts as no evidence (0), so the verdict moves every session it is in."""
    return [0.0 if s.verdict == "normal" else s.score for s in lines]
