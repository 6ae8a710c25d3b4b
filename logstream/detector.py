"""The detector: records in, scored lines out (normalize -> tokens -> engine -> scorer).

This is the one object that every source drives (replay, tail, serve, calibration, the
benchmarks): `score` turns records into ScoredLines, `close` ends a stream and scores its
end, `score_streams` does both for whole streams (sessions), and `anomaly` builds the one
`Anomaly` that alerts carry. The model part is `token_surprisal`; the stages after it are
`scoring.scorer.Scorer`'s.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logstream.engine.model import load_model_dir, model_id
from logstream.engine.streaming import StreamingEngine
from logstream.engine.tokenizer import LineTokenizer, prompt_ids
from logstream.records import Anomaly, LogRecord, Stream, location
from logstream.scoring.calibration import Calibration
from logstream.scoring.config import ScoringConfig
from logstream.scoring.evidence import surprising_tokens
from logstream.scoring.quiet import BaselineRhythm, QuietWatch
from logstream.scoring.rules import OperatorRules
from logstream.scoring.scorer import ScoredLine, Scorer, end_of_stream, session_evidence
from logstream.text.explain import Explanation, explain_line, line_token_offsets
from logstream.text.normalize import Normalizer

__all__ = ["Detector", "ScoredLine", "ScoredSession", "Step"]


@dataclass(frozen=True)
class ScoredSession:
    """A whole stream scored and closed: its lines, its end (None unless scored), its score."""

    stream: str
    lines: list[ScoredLine]
    end: ScoredLine | None
    score: float  # the calibrated session score (Calibration.session_score)

    @property
    def worst(self) -> ScoredLine | None:
        """What a session alert shows: a line an operator confirmed as an anomaly, else a line
        of the critical level not marked normal (it alerts whatever the session's score), else
        the line (or end) with the highest score among those not marked normal."""
        every = [*self.lines, *([self.end] if self.end else [])]
        confirmed = [s for s in every if s.verdict == "anomaly"]
        critical = [s for s in every if s.level == "critical" and s.verdict != "normal"]
        return max(
            confirmed or critical or every, key=lambda s: (s.verdict != "normal", s.score), default=None
        )

    @property
    def scored(self) -> ScoredLine | None:
        """The session as one scored item, as replay reports it: its worst line carrying the
        session's score (so it alerts as that line's `is_anomaly` says); None when empty."""
        worst = self.worst
        return dataclasses.replace(worst, score=self.score) if worst is not None else None


@dataclass(frozen=True)
class Step:
    """What one batch of records yields (`Detector.step`)."""

    lines: list[ScoredLine]  # one per record, in order
    quiet: list[ScoredLine]  # kind "quiet": the sources the batch shows to have stopped logging


class Detector:
    """Scores LogRecords with a trained model directory; see `load`.

    `false_alarm_rate` (or an explicit `threshold` in -log10 p) sets the sensitivity;
    default: the rate saved with the model. `rules`: operators' verdicts
    (`feedback.FeedbackRules`), obeyed as serve, tail and replay all do.
    `int8_ring` stores each stream's K/V as int8 with per (token, kv head) scales: 1/4 of
    the ring's memory, CPU only; `dtype` (e.g. torch.bfloat16) sets the weights' and the
    cache's dtype (benchmarks/ring_precision.py measures what each changes).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: LineTokenizer,
        meta: dict[str, Any],
        *,
        device: str | None = None,
        window: int | None = None,
        max_streams: int = 64,
        chunk_tokens: int = 256,
        model_id: str = "",
        false_alarm_rate: float | None = None,
        threshold: float | None = None,
        rules: OperatorRules | None = None,
        int8_ring: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if false_alarm_rate is not None and not 0 < false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate: {false_alarm_rate} is not in (0, 1)")
        self.meta = meta
        self.tokenizer = tokenizer
        self.normalizer = Normalizer.from_json(meta["mask_rules"])
        self.model_id = model_id or meta.get("model_id", "")
        self.false_alarm_rate = false_alarm_rate
        self.fixed_threshold = threshold
        self.scorer = Scorer(
            Calibration.from_json(meta["calibration"]),
            meta.get("templates", []),
            rules,
            meta.get("template_counts"),
        )
        # the sources' rhythms in the training lines: a quiet watch starts from them (logstream.scoring.quiet)
        self.quiet_baseline = {
            source: BaselineRhythm.from_json(rhythm)
            for source, rhythm in meta.get("quiet_baseline", {}).items()
        }
        sink_ids = prompt_ids(tokenizer, meta["pattern_prompt"], meta["sink_tokens"])
        self.engine = StreamingEngine(
            model, sink_ids, window=window or meta["window"], max_streams=max_streams,
            chunk_tokens=chunk_tokens, device=device, int8_ring=int8_ring, dtype=dtype,
        )  # fmt: skip
        self.peak_cache_bytes = 0  # the most cache memory held after any batch

    @classmethod
    def load(cls, model_dir: Path | str, **options: Any) -> Detector:
        """Load a model directory; raises ModelDirError with one clear line if it is unusable."""
        model, tokenizer, meta = load_model_dir(model_dir)
        return cls(model, tokenizer, meta, model_id=model_id(model_dir), **options)

    @property
    def calibration(self) -> Calibration:
        return self.scorer.calibration

    @calibration.setter
    def calibration(self, calibration: Calibration) -> None:
        """A new calibration (train, benchmarks) restarts the online tail from its line tail."""
        self.scorer.calibration = calibration

    @property
    def rules(self) -> OperatorRules | None:
        return self.scorer.rules

    @rules.setter
    def rules(self, rules: OperatorRules | None) -> None:
        self.scorer.rules = rules

    @property
    def scoring(self) -> ScoringConfig:
        return self.scorer.calibration.config

    def reset(self) -> None:
        """Forget every stream and every template learned since loading: score afresh."""
        for stream in list(self.engine.streams):
            self.engine.drop(stream)
        self.scorer.reset()

    @property
    def threshold(self) -> float:
        """The line threshold in -log10 p (the same unit for every model)."""
        if self.fixed_threshold is not None:
            return self.fixed_threshold
        return self.calibration.threshold(self.false_alarm_rate)

    @property
    def cache_bytes(self) -> int:
        return self.engine.cache_bytes

    @property
    def learned_stream_ends(self) -> bool:
        return self.calibration.learned_stream_ends

    def token_surprisal(
        self, records: Sequence[LogRecord]
    ) -> tuple[list[str], list[list[int]], list[np.ndarray]]:
        """Masked text, token ids and per-token surprisal of each record, in order.

        Lines of a stream are scored in that stream's context (its cache advances).
        """
        masked = [self.normalizer.mask(r.line) for r in records]
        token_ids = self.tokenizer.encode_lines(masked)
        by_stream: dict[str, list[int]] = defaultdict(list)  # stream -> record indices
        for i, record in enumerate(records):
            by_stream[record.stream].append(i)
        nll = self.engine.score({s: [token_ids[i] for i in idx] for s, idx in by_stream.items()})
        surprisal: list[np.ndarray] = [np.zeros(0)] * len(records)
        for stream, indices in by_stream.items():
            for i, token_nll in zip(indices, nll[stream], strict=True):
                surprisal[i] = token_nll
        return masked, token_ids, surprisal

    def score(self, records: Sequence[LogRecord]) -> list[ScoredLine]:
        """One ScoredLine per record, in order. Lines of a stream keep that stream's context."""
        masked, token_ids, token_nll = self.token_surprisal(records)
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.engine.cache_bytes)
        starts = [self.tokenizer.word_starts(ids) for ids in token_ids]
        scored = self.scorer.score(records, masked, token_nll, starts, self.threshold)
        return [
            self._explained(line, masked[i], token_ids[i], token_nll[i]) if line.is_anomaly else line
            for i, line in enumerate(scored)
        ]

    def _explained(
        self, line: ScoredLine, masked: str, token_ids: list[int], token_nll: np.ndarray
    ) -> ScoredLine:
        """The alert's explanation: its surprising words (only alerts pay for it: one more
        tokenizer call) and tokens."""
        offsets = line_token_offsets(self.tokenizer, masked)
        record = line.record
        explanation: Explanation = explain_line(
            record.line,
            self.normalizer.rules,
            masked,
            offsets,
            token_nll,
            record.stream,
            line.novel,
            line.burst,
            line.rarity,
        )
        tokens = tuple(
            (self.tokenizer.token_text(token_ids[pos]), nll) for pos, nll in surprising_tokens(token_nll)
        )
        return dataclasses.replace(line, explanation=explanation, top_tokens=tokens)

    def close(self, stream: str, *, end: bool | None = None) -> ScoredLine | None:
        """End a stream: score the end-of-stream token and free its cache.

        `end`: whether to score the end (default: when the model learned stream ends;
        calibration asks for it to learn them, and not for streams that did not end)."""
        scored = None
        if (self.learned_stream_ends if end is None else end) and stream in self.engine.streams:
            nll = self.engine.end_nll(stream, self.tokenizer.eos_id)
            scored = end_of_stream(stream, nll, self.calibration, self.threshold)
        self.engine.drop(stream)
        self.scorer.close(stream)
        return scored

    def step(self, records: Sequence[LogRecord], watch: QuietWatch | None) -> Step:
        """One batch as serve, tail and replay all drive it: its lines scored, then the sources
        it shows to have stopped logging."""
        return Step(self.score(records) if records else [], self.quiet_sources(watch, records))

    def quiet_sources(self, watch: QuietWatch | None, records: Sequence[LogRecord]) -> list[ScoredLine]:
        """The sources that `records` show to have stopped logging (`logstream.scoring.quiet`), as
        ScoredLines of kind "quiet" at the line threshold, each carrying the line that showed
        it; none without a watch (switched off). The watch is the caller's: it outlives a
        model switch (serve) and a chunk's model (replay), since a source's rhythm is not the
        model's; a source the watch has not heard yet starts from its rhythm in this model's
        training lines (`quiet_baseline`)."""
        if watch is None:
            return []
        threshold, out = self.threshold, []
        for record in records:
            for quiet in watch.observe(record.stream, record.line, threshold, self.quiet_baseline):
                out.append(
                    ScoredLine(
                        record=dataclasses.replace(record, line=quiet.describe(), timestamp=quiet.noticed_at),
                        score=quiet.score,
                        threshold=threshold,
                        surprisal=quiet.noticed_at - quiet.last_seen,
                        kind="quiet",
                        template=f"quiet source: {quiet.source}",
                    )
                )
        return out

    def score_streams(self, streams: Sequence[Stream], *, ends: bool | None = None) -> list[ScoredSession]:
        """Score whole streams together (one batch) and close each. A stream that `ended`
        (a session) gets its end scored as `close(end=ends)` decides: by default when the
        model learned ends; calibration, which is about to learn them, passes True."""
        scored = self.score([LogRecord(line=line, stream=s.name) for s in streams for line in s.lines])
        by_stream: dict[str, list[ScoredLine]] = {s.name: [] for s in streams}
        for line in scored:
            by_stream[line.record.stream].append(line)
        out = []
        for stream in streams:
            lines = by_stream[stream.name]
            end = self.close(stream.name, end=ends if stream.ended else False)
            score = self.calibration.session_score(session_evidence(lines), end.score if end else None)
            out.append(ScoredSession(stream.name, lines, end, score))
        return out

    def anomaly(self, scored: ScoredLine) -> Anomaly | None:
        """The alert's anomaly for a scored line or end (None unless it alerts): the one
        place an `Anomaly` is built, for replay, tail and serve alike."""
        if not scored.is_anomaly:
            return None
        record = scored.record
        return Anomaly(
            stream=record.stream,
            line=record.line,
            score=scored.score,
            threshold=scored.threshold,
            surprisal=scored.surprisal,
            severity=scored.severity,
            kind=scored.kind,
            level=scored.level,
            template_id=scored.template_id,
            template=scored.template,
            top_tokens=scored.top_tokens,
            source=record.source,
            offset=record.offset,
            model_id=self.model_id,
            event_time=record.timestamp,
            location=location(record),
            model_version=str(self.meta.get("created_at", "")),
            labels=record.labels,
            explanation=scored.explanation.summary if scored.explanation is not None else "",
        )
