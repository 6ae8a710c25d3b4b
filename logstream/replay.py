"""`logstream replay`: stream a file through the detector as if it were live, then report.

Without `--model` the detector is trained on the input itself, never on what it
then scores:
- `first` (default): train on the first TRAIN_FRACTION of the input, score the rest.
- `all`: prequential. The input is cut into PREQUENTIAL_CHUNKS chunks; chunk k >= 1
  is scored by the model trained (robustly, continued) on chunks 0..k-1, and
  chunk 0 by a model trained on chunk 1. Every line is scored, none by a model
  that has learned it.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from logstream.detector import Detector, ScoredLine
from logstream.inputs import (
    InputStats,
    Session,
    compile_stream_key,
    read_labels,
    read_lines,
    read_sessions,
    stream_of,
    streams_from_lines,
    streams_from_sessions,
)
from logstream.records import LogRecord
from logstream.scoring import auc_pr, auc_roc, best_f1, precision_recall_f1, session_score
from logstream.train import Stream, TrainConfig, Trained, train

TRAIN_FRACTION = 0.5
PREQUENTIAL_CHUNKS = 4
LINE_BATCH = 1024  # lines per detector call (lines format)
SESSION_BATCH = 64  # sessions per detector call (sessions format)


@dataclass
class ReplayOptions:
    input: Path
    model: Path | None = None
    format: str = "lines"
    labels: Path | None = None
    stream_key: str | None = None
    out: Path | None = None
    auto_train: str = "first"  # "first" | "all" (only without --model)
    train_config: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class Unit:
    """What is scored and evaluated: a line (lines format) or a session (sessions format)."""

    stream: str
    text: str  # the line, or the session's most surprising line
    score: float
    threshold: float
    label: int | None
    top_tokens: tuple[tuple[str, float], ...] = ()
    index: int = 0  # line number (lines) or session number (sessions), 0-based

    @property
    def is_anomaly(self) -> bool:
        return self.score > self.threshold


@dataclass
class ReplayReport:
    units: list[Unit]
    lines: int
    streams: int
    threshold: float
    seconds: float
    peak_cache_bytes: int
    bad_input: dict[str, int]
    unit: str  # "line" | "session"

    def summary(self) -> dict[str, Any]:
        scores = np.array([u.score for u in self.units])
        out: dict[str, Any] = {
            "lines": self.lines,
            "streams": self.streams,
            "unit": self.unit,
            "scored": len(self.units),
            "anomalies": sum(u.is_anomaly for u in self.units),
            "threshold": round(self.threshold, 4),
            "lines_per_second": round(self.lines / self.seconds, 1) if self.seconds else None,
            "peak_cache_bytes": self.peak_cache_bytes,
            "bad_input": self.bad_input,
        }
        labels = [u.label for u in self.units]
        if labels and all(label is not None for label in labels):
            y = np.array(labels)
            flagged = np.array([u.score - u.threshold for u in self.units])  # > 0 = flagged
            precision, recall, f1 = precision_recall_f1(flagged, y, 0.0)
            out |= {
                "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
                "best_f1": round(best_f1(scores, y), 4),
                "auc_roc": round(auc_roc(scores, y), 4), "auc_pr": round(auc_pr(scores, y), 4),
                "positives": int(y.sum()),
            }  # fmt: skip
        return out


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Scorer:
    """Drives a detector over records or sessions, keeping peak cache bytes."""

    def __init__(self, detector: Detector, tick: Callable[[int], None]) -> None:
        self.detector, self.tick, self.peak_cache_bytes = detector, tick, 0

    def lines(
        self, lines: list[str], first_index: int, streams: list[str], labels: list[int] | None
    ) -> list[Unit]:
        units = []
        records = [
            LogRecord(line=line, stream=s, offset=first_index + i)
            for i, (line, s) in enumerate(zip(lines, streams, strict=True))
        ]
        for batch in _batches(records, LINE_BATCH):
            for scored in self.detector.score(batch):
                i = scored.record.offset
                units.append(self._unit(scored, labels[i] if labels else None, i))
            self.peak_cache_bytes = max(self.peak_cache_bytes, self.detector.cache_bytes)
            self.tick(len(batch))
        for stream in set(streams):
            self.detector.close(stream)
        return units

    def sessions(self, sessions: list[Session], first_index: int) -> list[Unit]:
        units = []
        threshold = self.detector.calibration.session_threshold or self.detector.threshold
        for offset, batch in enumerate(_batches(sessions, SESSION_BATCH)):
            records = [LogRecord(line=line, stream=s.id) for s in batch for line in s.lines]
            scored = self.detector.score(records)
            self.peak_cache_bytes = max(self.peak_cache_bytes, self.detector.cache_bytes)
            by_session: dict[str, list[ScoredLine]] = {}
            for s in scored:
                by_session.setdefault(s.record.stream, []).append(s)
            for j, session in enumerate(batch):
                lines = by_session.get(session.id, [])
                end = self.detector.close(session.id)
                score = session_score([s.score for s in lines], end.score if end else None)
                worst = max([*lines, *([end] if end else [])], key=lambda s: s.score, default=None)
                units.append(Unit(
                    stream=session.id, text=worst.record.line if worst else "", score=score,
                    threshold=threshold, label=session.label,
                    top_tokens=worst.top_tokens if worst else (),
                    index=first_index + offset * SESSION_BATCH + j,
                ))  # fmt: skip
            self.tick(len(records))
        return units

    @staticmethod
    def _unit(scored: ScoredLine, label: int | None, index: int) -> Unit:
        return Unit(
            stream=scored.record.stream, text=scored.record.line, score=scored.score,
            threshold=scored.threshold, label=label, top_tokens=scored.top_tokens, index=index,
        )  # fmt: skip


def _train_on(streams: list[Stream], config: TrainConfig, start_from: Trained | None = None) -> Detector:
    trained = train(streams, config, start_from=start_from)
    return Detector(trained.model, trained.tokenizer, trained.meta, model_id="replay-auto-train")


def _trained_parts(detector: Detector) -> Trained:
    return Trained(detector.engine.model, detector.tokenizer, detector.meta)


@dataclass
class ReplayInput:
    """The validated input: lines or sessions, labels, and the stream key."""

    items: list[Any]  # lines (str) or Session
    labels: list[int] | None
    key: re.Pattern[str] | None
    stats: InputStats
    detector: Detector | None  # loaded from --model, else trained during the replay


def load_replay_input(options: ReplayOptions) -> ReplayInput:
    """Read and check input and model before any work starts; raises InputError/ModelDirError."""
    stats = InputStats()
    key = compile_stream_key(options.stream_key)
    if options.format == "sessions":
        items: list[Any] = read_sessions(options.input, stats)
    else:
        items = read_lines(options.input, stats)
    labels = read_labels(options.labels, len(items)) if options.labels and options.format == "lines" else None
    detector = Detector.load(options.model) if options.model is not None else None
    return ReplayInput(items, labels, key, stats, detector)


def run_replay(
    options: ReplayOptions, data: ReplayInput, tick: Callable[[int], None] = lambda n: None
) -> ReplayReport:
    """Score the input as if it were live; train on it first when no model is given."""
    items, labels, key, stats = data.items, data.labels, data.key, data.stats
    config = options.train_config
    if options.format == "sessions":
        to_streams: Callable[[list[Any]], list[Stream]] = streams_from_sessions
    else:
        to_streams = lambda lines: streams_from_lines(lines, key)  # noqa: E731

    # (first index, items, detector) per part scored by one model
    if data.detector is not None:
        parts = [(0, items, data.detector)]
    elif options.auto_train == "first":
        cut = int(len(items) * TRAIN_FRACTION)
        parts = [(cut, items[cut:], _train_on(to_streams(items[:cut]), config))]
    else:
        bounds = np.linspace(0, len(items), PREQUENTIAL_CHUNKS + 1).astype(int)
        chunks = [items[a:b] for a, b in itertools.pairwise(bounds)]
        parts = [(0, chunks[0], _train_on(to_streams(chunks[1]), config))]
        detector = None
        for k in range(1, PREQUENTIAL_CHUNKS):
            start = _trained_parts(detector) if detector else None
            detector = _train_on(to_streams(chunks[k - 1]), config, start_from=start)
            parts.append((int(bounds[k]), chunks[k], detector))

    started = time.perf_counter()
    units: list[Unit] = []
    peak = scored_lines = 0
    stream_names: set[str] = set()
    for first, part, detector in parts:
        scorer = _Scorer(detector, tick)
        if options.format == "sessions":
            units += scorer.sessions(part, first)
            stream_names.update(s.id for s in part)
            scored_lines += sum(len(s.lines) for s in part)
        else:
            streams = [stream_of(line, key) for line in part]
            units += scorer.lines(part, first, streams, labels)
            stream_names.update(streams)
            scored_lines += len(part)
        peak = max(peak, scorer.peak_cache_bytes)
    seconds = time.perf_counter() - started
    report = ReplayReport(
        units=units, lines=scored_lines, streams=len(stream_names),
        threshold=units[-1].threshold if units else parts[-1][2].threshold,
        seconds=seconds, peak_cache_bytes=peak, bad_input=stats.as_dict(),
        unit="session" if options.format == "sessions" else "line",
    )  # fmt: skip
    if options.out:
        write_scores(report, options.out)
    return report


def write_scores(report: ReplayReport, path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for u in report.units:
            row = {"index": u.index, "stream": u.stream, "score": round(u.score, 4), "threshold": round(u.threshold, 4),
                   "anomaly": u.is_anomaly, "label": u.label, "text": u.text}  # fmt: skip
            f.write(json.dumps(row) + "\n")
