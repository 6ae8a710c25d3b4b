"""The scorer: one line's stages, in order, for every line the model has read.

1. evidence: the line's surprisal under the model (`evidence.line_surprisal`) and its
   template (online Drain, seeded with the training templates: `novel` when it is new);
2. prior: its level, from a level field or failure words (`ScoringConfig.level`);
3. calibration: surprisal -> -log10 p under the line tail, plus the level's prior
   (`Calibration.line_score`); the tail is refitted online on lines that did not alert;
4. operator rules: a verdict on its template (`rules.OperatorRules`). "normal": never an
   alert, and the line joins the normal sample of the online refit; "anomaly": always an
   alert, and the line stays out of it.

`Scorer.score` takes what the model computed (`Detector.token_surprisal`), so benchmarks can
run the stages again over cached model output with other constants (benchmarks/quality.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from logstream.records import LogRecord
from logstream.scoring.calibration import Calibration
from logstream.scoring.evidence import line_surprisal
from logstream.scoring.gpd import OnlineTail
from logstream.scoring.rules import OperatorRules
from logstream.text.explain import Explanation
from logstream.text.patterns import seeded_miner


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
    explanation: Explanation | None = None  # the surprising words (alerts only)
    top_tokens: tuple[tuple[str, float], ...] = ()  # the most surprising tokens (alerts only)

    @property
    def is_anomaly(self) -> bool:
        if self.verdict is not None:
            return self.verdict == "anomaly"
        return self.score > self.threshold

    @property
    def suppressed(self) -> bool:
        """Over the threshold, but its template was marked normal."""
        return self.verdict == "normal" and self.score > self.threshold


class Scorer:
    """Stages 1-4 for lines whose token surprisal the model computed; see the module doc."""

    def __init__(
        self, calibration: Calibration, known_templates: Sequence[str], rules: OperatorRules | None = None
    ) -> None:
        self.known_templates = list(known_templates)
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
        """Forget the templates learned since loading."""
        self.miner = seeded_miner(self.known_templates)
        self.known = self.miner.size  # clusters 1..known are training templates

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
            score = calibration.line_score(surprisal, level, fit)
            verdict = self.rules.verdict(text, record.stream) if self.rules is not None else None
            line = ScoredLine(
                record, score, threshold, surprisal, level, mined.template_id, mined.template,
                novel=mined.cluster > self.known, verdict=verdict,
            )  # fmt: skip
            if self.online is not None and verdict != "anomaly":
                # the tail is of surprisal: a line beyond it by its surprisal alone stays out
                beyond = verdict is None and score - config.prior(level) > threshold
                self.online.observe(surprisal, beyond, rate)
            out.append(line)
        return out


def session_evidence(lines: Sequence[ScoredLine]) -> list[float]:
    """The lines' scores as a session's evidence: a line whose template an operator marked
    normal counts as no evidence (0), so the verdict moves every session it is in."""
    return [0.0 if s.verdict == "normal" else s.score for s in lines]
