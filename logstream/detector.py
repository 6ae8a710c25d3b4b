"""The detector: records in, scored lines out (normalize -> tokens -> engine -> scores).

This is the one object that every source drives (replay, tail, serve,
calibration, the benchmarks): `score` turns records into ScoredLines, `close`
ends a stream and scores its end, `score_streams` does both for whole streams
(sessions), and `anomaly` builds the one `Anomaly` that alerts carry. The raw
line score is `line_evidence`, written once.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logstream.engine import StreamingEngine
from logstream.explain import Explanation, explain_line, line_token_offsets
from logstream.feedback import FeedbackRules
from logstream.following import AlertFollowing, names_its_part, place
from logstream.model import load_model_dir, model_id
from logstream.normalize import Normalizer
from logstream.patterns import RecentPatterns, seeded_miner
from logstream.quiet import BaselineRhythm, QuietWatch
from logstream.records import Anomaly, LogRecord, Stream, location
from logstream.scoring import (
    Calibration,
    Observation,
    ScoringConfig,
    line_units,
    severity,
    surprising_tokens,
    top_mean,
    unseen,
)
from logstream.tail import OnlineTail, TailFit
from logstream.tokenizer import LineTokenizer, prompt_ids

SINK_MODES = ("patterns", "bos", "none")  # ablations: the pattern prompt, BOS only, no sinks


@dataclass(frozen=True)
class ScoredLine:
    record: LogRecord
    score: float  # calibrated: -log10 P(a normal line scores this high), compared with `threshold`
    raw: float  # evidence, nats: surprisal + priors - template offset (the line tail's); "quiet": the silence, s
    surprisal: float  # nats/token from the model alone (for kind "end": the end token's NLL)
    threshold: float
    level: str | None = None  # severity from the level field or failure words
    novel: bool = False  # the line's template is new to the model
    repeats: int = 0  # times its template occurred in the stream's recent lines (burst discount)
    template_id: int | None = None
    template: str | None = None
    known_template: int | None = None  # cluster number of the training template it matched (None: new)
    capped: float | None = None  # nats: the capped statistic's surprisal (scoring; None: off)
    crash: bool = False  # unseen, and its words name a crash (`ScoringConfig.names_crash`)
    follows: bool = False  # unseen, right after its source's alert: its score is that alert's (`following`)
    top_tokens: tuple[tuple[str, float], ...] = ()  # the most surprising tokens (anomalies only)
    kind: str = "line"  # "line" | "end" | "quiet" (a source that stopped logging; logstream.quiet)
    explanation: Explanation | None = None  # the surprising words (anomalies only; `explain`)
    suppressed: bool = False  # an operator marked its template normal (logstream.feedback)

    @property
    def is_anomaly(self) -> bool:
        return self.score > self.threshold and not self.suppressed


@dataclass(frozen=True)
class ScoredSession:
    """A whole stream scored and closed: its lines, its end (None unless scored), its score."""

    stream: str
    lines: list[ScoredLine]
    end: ScoredLine | None
    score: float  # the calibrated session score (scoring.Calibration.session_score)

    @property
    def worst(self) -> ScoredLine | None:
        """The line (or end) with the highest score: what a session alert shows."""
        return max([*self.lines, *([self.end] if self.end else [])], key=lambda s: s.score, default=None)


@dataclass(frozen=True)
class LineEvidence:
    surprisal: float  # the model's part, nats: mean NLL of the top-k words (or tokens)
    level: str | None  # severity from the level field or failure words
    raw: float  # nats: surprisal + severity prior + novelty - burst discount - template offset
    capped: float | None = None  # nats: the capped statistic's surprisal (None: off)
    capped_raw: float | None = None  # nats: that plus the same priors (what the capped tail calibrates)
    crash: bool = False  # unseen, and its words name a crash: the score gains the crash bonus


def line_evidence(
    calibration: Calibration,
    token_nll: np.ndarray,
    line: str,
    novel: bool = False,
    repeats: int = 0,
    template: int | None = None,
    word_starts: np.ndarray | None = None,
    vocab_size: int | None = None,
) -> LineEvidence:
    """The raw line score (what the line tail calibrates), the one formula: token surprisal
    -> top-k line surprisal (of words: `word_starts` says which tokens begin one; or of
    tokens, as `line_unit` says) -> plus the level and novelty priors, less the burst
    discount and the known `template`'s offset (`Calibration.evidence`). With `capped_top_k`
    also the capped statistic: each token's NLL capped at `token_cap` x ln `vocab_size`."""
    config = calibration.config
    if config.line_unit == "word" and word_starts is None:
        raise ValueError("line_evidence: line_unit 'word' needs the line's word_starts")
    units = line_units(token_nll, word_starts if config.line_unit == "word" else None)  # [words]
    surprisal = top_mean(units, config.line_top_k)
    capped = None
    if config.capped_top_k:
        if vocab_size is None:
            raise ValueError("line_evidence: the capped statistic needs the vocab_size")
        # a word's capped NLL: its most surprising token's, capped (the max of the capped tokens)
        capped = top_mean(np.minimum(units, config.token_cap * math.log(vocab_size)), config.capped_top_k)
    severity = config.severity(line)
    crash = vocab_size is not None and config.names_crash(line, severity) and unseen(token_nll, vocab_size)
    seen = Observation(surprisal, severity, novel, repeats, template, capped)
    return LineEvidence(
        surprisal, severity, calibration.evidence(seen), capped, calibration.capped_evidence(seen), crash
    )


class Detector:
    """Scores LogRecords with a trained model directory; see `load`.

    `false_alarm_rate` (or an explicit `threshold` in -log10 p) sets the sensitivity;
    default: the rate saved with the model. The line tail is refitted online on
    unflagged lines (`ScoringConfig.refit_every`), line by line, so a replay backtests
    serve whatever the batches.
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
        sinks: str = "patterns",
        model_id: str = "",
        false_alarm_rate: float | None = None,
        threshold: float | None = None,
        int8_ring: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if sinks not in SINK_MODES:
            raise ValueError(f"sinks: unknown {sinks!r}; expected one of {SINK_MODES}")
        if false_alarm_rate is not None and not 0 < false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate: {false_alarm_rate} is not in (0, 1)")
        self.meta = meta
        self.tokenizer = tokenizer
        self.normalizer = Normalizer.from_json(meta["mask_rules"])
        self.model_id = model_id or meta.get("model_id", "")
        self.false_alarm_rate = false_alarm_rate
        self.fixed_threshold = threshold
        self.known_templates = list(meta.get("templates", []))
        self.calibration = Calibration.from_json(meta["calibration"])
        # the sources' rhythms in the training lines: a quiet watch starts from them (logstream.quiet)
        self.quiet_baseline = {
            source: BaselineRhythm.from_json(rhythm)
            for source, rhythm in meta.get("quiet_baseline", {}).items()
        }
        self.miner = seeded_miner(self.known_templates)
        self.known_clusters = self.miner.size  # clusters 1..known_clusters are training templates
        self.following = AlertFollowing()
        self.feedback: FeedbackRules | None = None  # templates operators marked normal
        sink_ids = {
            "patterns": prompt_ids(tokenizer, meta["pattern_prompt"], meta["sink_tokens"]),
            "bos": [tokenizer.bos_id],
            "none": [],
        }[sinks]
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
        return self._calibration

    @calibration.setter
    def calibration(self, calibration: Calibration) -> None:
        """A new calibration (train, benchmarks) restarts the online tails from its line tails."""
        self._calibration = calibration
        self.recent = RecentPatterns(calibration.config.repeat_window)
        every = calibration.config.refit_every
        line, capped = calibration.line, calibration.capped
        self.online = OnlineTail(line, calibration.line_reference, every) if line is not None else None
        self.online_capped = (
            OnlineTail(capped, calibration.capped_reference, every) if capped is not None else None
        )

    @property
    def tails(self) -> tuple[TailFit | None, TailFit | None]:
        """The line tails scoring reads now: the first statistic's and the capped one's, each its
        online refit where it has one, else the calibrated tail."""
        line = self.online.fit if self.online else self.calibration.line
        capped = self.online_capped.fit if self.online_capped else self.calibration.capped
        return line, capped

    @property
    def scoring(self) -> ScoringConfig:
        return self._calibration.config

    def reset(self) -> None:
        """Forget every stream and every template learned since loading: score afresh."""
        for stream in list(self.engine.streams):
            self.engine.drop(stream)
        self.recent.clear()
        self.following.clear()
        self.miner = seeded_miner(self.known_templates)

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
        masked, token_ids, surprisal = self.token_surprisal(records)
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.engine.cache_bytes)
        threshold = self.threshold
        rate = 10**-threshold  # the share of normal lines it flags: what the online tails expect
        if self.feedback is not None:
            self.feedback.refresh()  # at most every refresh_seconds: another replica's verdicts
        out = []
        for i, (record, token_nll) in enumerate(zip(records, surprisal, strict=True)):
            mined = self.miner.add(masked[i])
            repeats = self.recent.add(record.stream, mined.template_id)
            known = mined.cluster if mined.cluster <= self.known_clusters else None
            words = self.tokenizer.word_starts(token_ids[i]) if self.scoring.line_unit == "word" else None
            evidence = line_evidence(
                self.calibration, token_nll, record.line, mined.new, repeats, known, words,
                self.tokenizer.vocab_size,
            )  # fmt: skip
            line_tail, capped_tail = self.tails
            score = self.calibration.line_score(
                evidence.raw, line_tail, evidence.capped_raw, capped_tail, evidence.crash
            )
            over = score > threshold
            at = None  # where the line was written: needed only to record an alert, or to follow one
            if self.scoring.follow_alerts and (over or self.following.pending(record.stream)):
                at = place(record.stream, record.line)
            followed = None if over else self.following.alert_before(at)
            follows = (
                followed is not None
                and names_its_part(followed, evidence.level, self.scoring.follow_same_process)
                and unseen(token_nll, self.tokenizer.vocab_size)
            )
            if follows:
                score, over = followed.score, True
            suppressed = over and self.feedback is not None and self.feedback.is_normal(mined.template)
            alerting = over and not suppressed  # only alerts pay for their explanation
            out.append(
                ScoredLine(
                    record=record,
                    score=score,
                    raw=evidence.raw,
                    surprisal=evidence.surprisal,
                    threshold=threshold,
                    level=evidence.level,
                    novel=mined.new,
                    repeats=repeats,
                    template_id=mined.template_id,
                    template=mined.template,
                    known_template=known,
                    capped=evidence.capped,
                    crash=evidence.crash,
                    follows=follows,
                    top_tokens=tuple(
                        (self.tokenizer.token_text(token_ids[i][pos]), nll_)
                        for pos, nll_ in surprising_tokens(token_nll)
                    )
                    if alerting
                    else (),
                    explanation=self._explain(record, masked[i], token_nll, mined.new) if alerting else None,
                    suppressed=suppressed,
                )
            )
            self.following.record(at, score if alerting else None)
            if self.online is not None:  # by score: feedback must not move the tail fit
                self.online.observe(evidence.raw, over, rate)
            if self.online_capped is not None and evidence.capped_raw is not None:
                self.online_capped.observe(evidence.capped_raw, over, rate)
        return out

    def _explain(self, record: LogRecord, masked: str, token_nll: np.ndarray, novel: bool) -> Explanation:
        """The line's surprising words (only anomalies pay for it: one more tokenizer call)."""
        offsets = line_token_offsets(self.tokenizer, masked)
        return explain_line(
            record.line, self.normalizer.rules, masked, offsets, token_nll, record.stream, novel
        )

    def close(self, stream: str, *, end: bool | None = None) -> ScoredLine | None:
        """End a stream: score the end-of-stream token and free its cache.

        `end`: whether to score the end (default: when the model learned stream ends;
        calibration asks for it to learn them, and not for streams that did not end)."""
        scored = None
        if (self.learned_stream_ends if end is None else end) and stream in self.engine.streams:
            nll = self.engine.end_nll(stream, self.tokenizer.eos_id)
            scored = ScoredLine(
                record=LogRecord(line="<end of stream>", stream=stream),
                score=self.calibration.end_score(nll),
                raw=nll,
                surprisal=nll,
                threshold=self.threshold,
                kind="end",
            )
        self.engine.drop(stream)
        self.recent.drop(stream)
        return scored

    def quiet_sources(self, watch: QuietWatch | None, records: Sequence[LogRecord]) -> list[ScoredLine]:
        """The sources that `records` show to have stopped logging (`logstream.quiet`), as
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
                        raw=quiet.noticed_at - quiet.last_seen,
                        surprisal=0.0,
                        threshold=threshold,
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
            score = self.calibration.session_score([s.score for s in lines], end.score if end else None)
            out.append(ScoredSession(stream.name, lines, end, score))
        return out

    def anomaly(self, scored: ScoredLine) -> Anomaly | None:
        """The alert's anomaly for a scored line or end (None below the threshold): the one
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
            severity=severity(scored.score, scored.threshold, scored.level),
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
        )
