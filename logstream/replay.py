"""`logstream replay`: stream a file through the detector as if it were live, then report.

Without `--model` the detector is trained on the input itself, never on what it
then scores:
- `first` (default): train on the first TRAIN_FRACTION of the input, score the rest.
- `all`: prequential. The input is cut into chunks that double in size (`chunk_bounds`:
  the first holds max(MIN_FIRST_CHUNK, n / 16) items, as a tail fit wants a few hundred
  held-out lines, so 2k lines make 2 chunks, 5k lines 4 and 100k lines 5); chunk
  k >= 1 is scored by the model trained on chunks 0..k-1 (each model continues the
  previous one on the newest chunk), and chunk 0 by a model trained on chunk 1.
  Every line is scored, none by a model that has learned it.

Every chunk's scores are in the one calibrated unit (-log10 p, `scoring`), so they
share one threshold; the report lists each chunk's model and its raw-score threshold.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from logstream.detector import Detector, ScoredLine
from logstream.explain import Explanation
from logstream.inputs import (
    InputError,
    InputStats,
    Session,
    check_file,
    compile_stream_key,
    line_parser,
    read_labels,
    read_records,
    read_sessions,
    streams_from_records,
    streams_from_sessions,
)
from logstream.records import Anomaly, LogRecord, Stream
from logstream.scoring import auc_pr, auc_roc, best_f1, precision_recall_f1
from logstream.train import TrainConfig, Trained, train

TRAIN_FRACTION = 0.5
MIN_FIRST_CHUNK = 1000
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
    false_alarm_rate: float | None = None  # None: the model's own
    threshold: float | None = None  # in -log10 p; overrides false_alarm_rate


@dataclass(slots=True)
class Unit:
    """What is scored and evaluated: a line (lines format) or a session (sessions format).

    One is kept per scored item, so it holds no per-line extras (slots, no dict; the top
    tokens and explanation live in `anomaly`/`explanation`, set for anomalies only)."""

    stream: str
    text: str  # the line, or the session's most surprising line
    score: float  # calibrated, -log10 p
    threshold: float
    label: int | None
    index: int = 0  # item number (lines or sessions read), 0-based; labels are indexed by it
    raw: float = 0.0  # nats: surprisal + severity prior + novelty
    surprisal: float = 0.0  # nats/token, the model alone
    level: str | None = None
    novel: bool = False
    chunk: int = 0  # which model scored it (prequential replay)
    line: int = 0  # 1-based line number in the input file, as an editor counts (empty lines too)
    template: str | None = None  # the template mined for the line when it was scored
    explanation: Explanation | None = None  # its surprising words (anomalous lines only)
    new_words: tuple[str, ...] = ()  # explained words no earlier line of its stream had (`groups`)
    event_time: float | None = None  # the log's own time at the start of the line, if it has one
    anomaly: Anomaly | None = None  # what serve would hand to the alerts (Detector.anomaly)

    @property
    def is_anomaly(self) -> bool:
        return self.score > self.threshold


@dataclass(frozen=True)
class ChunkModel:
    """One model of a replay and what it scored: its thresholds, stated truthfully."""

    first: int  # first scored item (0-based)
    items: int
    train_lines: int
    train_steps: int
    window: int
    threshold: float  # -log10 p: the same for every chunk
    raw_threshold: float  # the raw score (nats) that this chunk's threshold corresponds to
    model_id: str = ""  # as alerts carry it: the model dir's name (or auto-train) @ data hash
    model_version: str = ""  # when the model was trained

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


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
    chunks: list[ChunkModel] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        scores = np.array([u.score for u in self.units])
        out: dict[str, Any] = {
            "lines": self.lines,
            "streams": self.streams,
            "unit": self.unit,
            "scored": len(self.units),
            "anomalies": sum(u.is_anomaly for u in self.units),
            "threshold": round(self.threshold, 4),
            "score_unit": "-log10 p",
            "false_alarms_per_1000": None,
            "chunks": [c.to_json() for c in self.chunks],
            "lines_per_second": round(self.lines / self.seconds, 1) if self.seconds else None,
            "peak_cache_bytes": self.peak_cache_bytes,
            "bad_input": self.bad_input,
        }
        labels = [u.label for u in self.units]
        if labels and all(label is not None for label in labels):
            y = np.array(labels)
            flagged = np.array([u.score - u.threshold for u in self.units])  # > 0 = flagged
            precision, recall, f1 = precision_recall_f1(flagged, y, 0.0)
            negatives = int((y == 0).sum())
            out["false_alarms_per_1000"] = (
                round(1000 * int(((flagged > 0) & (y == 0)).sum()) / negatives, 2) if negatives else None
            )
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
    """Drives one chunk's detector over records or sessions, as serve drives it."""

    def __init__(self, detector: Detector, chunk: int, tick: Callable[[int], None]) -> None:
        self.detector, self.chunk, self.tick = detector, chunk, tick

    def lines(self, records: list[LogRecord], first_index: int, labels: list[int] | None) -> list[Unit]:
        units = []
        for start in range(0, len(records), LINE_BATCH):
            batch = records[start : start + LINE_BATCH]
            for j, scored in enumerate(self.detector.score(batch)):
                i = first_index + start + j
                line = scored.record.offset + 1 if scored.record.offset is not None else i + 1
                units.append(self._unit(scored, scored, labels[i] if labels else None, i, line))
            self.tick(len(batch))
        for stream in {r.stream for r in records}:
            self.detector.close(stream)
        return units

    def sessions(self, sessions: list[Session], first_index: int, numbers: list[int]) -> list[Unit]:
        units = []
        for offset, batch in enumerate(_batches(sessions, SESSION_BATCH)):
            scored = self.detector.score_streams(streams_from_sessions(batch))
            for j, (session, result) in enumerate(zip(batch, scored, strict=True)):
                index = first_index + offset * SESSION_BATCH + j
                if result.worst is not None:  # the session alert: its worst line, the session's score
                    worst = dataclasses.replace(result.worst, score=result.score)
                    units.append(self._unit(result.worst, worst, session.label, index, numbers[index]))
            self.tick(sum(len(s.lines) for s in batch))
        return units

    def _unit(self, scored: ScoredLine, unit: ScoredLine, label: int | None, index: int, line: int) -> Unit:
        """`scored`: the line as scored; `unit`: the same carrying the unit's (session's) score."""
        return Unit(
            stream=unit.record.stream, text=scored.record.line, score=unit.score,
            threshold=scored.threshold, label=label, index=index,
            raw=scored.raw, surprisal=scored.surprisal, level=scored.level, novel=scored.novel,
            chunk=self.chunk, line=line, template=scored.template, explanation=scored.explanation,
            event_time=scored.record.timestamp, anomaly=self.detector.anomaly(unit),
        )  # fmt: skip


def chunk_bounds(n: int) -> list[int]:
    """Prequential chunk boundaries: the first chunk max(MIN_FIRST_CHUNK, n / 16) items, then
    each chunk as long as all before it (so a model has always seen half of what it scores);
    a remainder shorter than half a chunk joins the last chunk."""
    bounds = [0, min(max(MIN_FIRST_CHUNK, n // 16), n)]
    while bounds[-1] < n:
        doubled = 2 * bounds[-1]
        bounds.append(doubled if n - doubled >= bounds[-1] // 2 else n)
    if len(bounds) == 2 and n > 1:  # too short to chunk: two halves
        bounds = [0, n // 2, n]
    return bounds


@dataclass
class ReplayProgress:
    """Callbacks for the long phases: `phase(description, total)` starts one, `advance(n, info)`."""

    phase: Callable[[str, int | None], None] = lambda description, total: None
    advance: Callable[[int, str], None] = lambda n, info: None


@dataclass
class ReplayInput:
    """The validated input: records (lines format, as serve's parser made them) or sessions."""

    items: list[Any]  # LogRecord or Session
    labels: list[int] | None
    stats: InputStats
    detector: Detector | None  # loaded from --model, else trained during the replay
    numbers: list[int] = field(default_factory=list)  # sessions: each one's 1-based line in the file

    def __post_init__(self) -> None:
        if not self.numbers:  # items not read from a file: number them 1..n
            self.numbers = list(range(1, len(self.items) + 1))


def load_replay_input(options: ReplayOptions) -> ReplayInput:
    """Read and check input and model before any work starts; raises InputError/ModelDirError."""
    stats = InputStats()
    compile_stream_key(options.stream_key)  # a bad --stream-key fails before any work
    check_file(options.input)
    numbers: list[int] = []
    detector = Detector.load(options.model, **_sensitivity(options)) if options.model is not None else None
    if options.format == "sessions":
        items: list[Any] = read_sessions(options.input, stats, numbers)
    else:
        # without --stream-key, the streams the model was trained on (a forgotten key would put
        # every line into one `default` stream)
        saved = detector.meta.get("stream_key") if detector is not None else None
        items = list(read_records(options.input, stats, line_parser(options.stream_key or saved)))
        if not items:
            raise InputError(f"{options.input}: no line to score ({stats.as_dict()} skipped)")
    labels = read_labels(options.labels, len(items)) if options.labels and options.format == "lines" else None
    return ReplayInput(items, labels, stats, detector, numbers)


def _sensitivity(options: ReplayOptions) -> dict[str, float | None]:
    return {"false_alarm_rate": options.false_alarm_rate, "threshold": options.threshold}


@dataclass
class Part:
    """Items scored by one model, and the items [start, stop) it was trained on (None: --model)."""

    first: int
    items: list[Any]
    detector: Detector
    trained_on: tuple[int, int] | None = None


def to_streams(options: ReplayOptions, data: ReplayInput, items: list[Any]) -> list[Stream]:
    if options.format == "sessions":
        return streams_from_sessions(items)
    return streams_from_records(items)


def _train_part(
    streams: list[Stream],
    options: ReplayOptions,
    progress: ReplayProgress,
    what: str,
    start_from: Trained | None,
) -> tuple[Trained, Detector]:
    progress.phase(f"training {what}", None)
    trained = train(
        streams, options.train_config, start_from=start_from,
        progress=lambda step, steps, loss: progress.advance(1, f"step {step}/{steps} loss {loss:.3f}"),
    )  # fmt: skip
    model_id = f"replay-auto-train@{trained.meta.get('data_sha256', '')[:12]}"
    detector = Detector(
        trained.model, trained.tokenizer, trained.meta, model_id=model_id, **_sensitivity(options)
    )
    return trained, detector


def train_parts(
    options: ReplayOptions, data: ReplayInput, progress: ReplayProgress | None = None
) -> list[Part]:
    """The models of a replay: --model, or trained on the input (`first` or prequential `all`)."""
    progress = progress or ReplayProgress()
    items = data.items
    if data.detector is not None:
        return [Part(0, items, data.detector)]
    if options.auto_train == "first":
        cut = int(len(items) * TRAIN_FRACTION)
        baseline = to_streams(options, data, items[:cut])
        _, detector = _train_part(baseline, options, progress, f"on items 1-{cut}", None)
        return [Part(cut, items[cut:], detector, (0, cut))]
    bounds = chunk_bounds(len(items))
    n = len(bounds) - 1
    baseline = to_streams(options, data, items[bounds[1] : bounds[2]])
    _, detector = _train_part(baseline, options, progress, f"chunk 1/{n} (to score chunk 0)", None)
    parts = [Part(0, items[: bounds[1]], detector, (bounds[1], bounds[2]))]
    trained = None
    for k in range(1, n):
        baseline = to_streams(options, data, items[bounds[k - 1] : bounds[k]])
        what = f"model {k}/{n - 1} on chunk {k - 1}" + (" (continued)" if trained else "")
        trained, detector = _train_part(baseline, options, progress, what, trained)
        parts.append(Part(bounds[k], items[bounds[k] : bounds[k + 1]], detector, (bounds[k - 1], bounds[k])))
    return parts


def run_replay(
    options: ReplayOptions, data: ReplayInput, progress: ReplayProgress | None = None
) -> ReplayReport:
    """Score the input as if it were live; train on it first when no model is given."""
    return score_parts(options, data, train_parts(options, data, progress), progress)


def score_parts(
    options: ReplayOptions, data: ReplayInput, parts: list[Part], progress: ReplayProgress | None = None
) -> ReplayReport:
    """Stream each part through its detector, in order, and report."""
    progress = progress or ReplayProgress()
    started = time.perf_counter()
    units: list[Unit] = []
    peak = scored_lines = 0
    stream_names: set[str] = set()
    models: list[ChunkModel] = []
    items = data.items
    total = sum(len(s.lines) for s in items) if options.format == "sessions" else len(items)
    progress.phase("scoring lines", total)
    for k, part in enumerate(parts):
        scorer = _Scorer(part.detector, k, lambda n: progress.advance(n, ""))
        if options.format == "sessions":
            units += scorer.sessions(part.items, part.first, data.numbers)
            stream_names.update(s.id for s in part.items)
            scored_lines += sum(len(s.lines) for s in part.items)
        else:
            units += scorer.lines(part.items, part.first, data.labels)
            stream_names.update(r.stream for r in part.items)
            scored_lines += len(part.items)
        peak = max(peak, part.detector.peak_cache_bytes)
        models.append(_chunk_model(part.detector, part.first, len(part.items)))
    seconds = time.perf_counter() - started
    report = ReplayReport(
        units=units, lines=scored_lines, streams=len(stream_names), threshold=parts[-1].detector.threshold,
        seconds=seconds, peak_cache_bytes=peak, bad_input=data.stats.as_dict(),
        unit="session" if options.format == "sessions" else "line", chunks=models,
    )  # fmt: skip
    if options.out:
        write_scores(report, options.out)
    return report


def _chunk_model(detector: Detector, first: int, items: int) -> ChunkModel:
    line_tail = detector.online.fit if detector.online else detector.calibration.line
    rate = 10**-detector.threshold
    return ChunkModel(
        first=first, items=items, train_lines=detector.meta.get("train_lines", 0),
        train_steps=detector.meta.get("train_steps", 0), window=detector.engine.window,
        threshold=detector.threshold,
        raw_threshold=line_tail.raw_threshold(rate) if line_tail is not None else detector.threshold,
        model_id=detector.model_id, model_version=str(detector.meta.get("created_at", "")),
    )  # fmt: skip


def write_scores(report: ReplayReport, path: Path) -> None:
    """One JSON row per scored item; `line` is 1-based in the input file, `index` the 0-based item."""
    with path.open("w", encoding="utf-8") as f:
        for u in report.units:
            row = {"line": u.line, "index": u.index, "stream": u.stream, "score": round(u.score, 4),
                   "threshold": round(u.threshold, 4), "anomaly": u.is_anomaly, "raw": round(u.raw, 4),
                   "surprisal": round(u.surprisal, 4), "level": u.level, "novel": u.novel, "chunk": u.chunk,
                   "label": u.label, "template": u.template, "text": u.text,
                   "explanation": u.explanation.to_json() if u.explanation else None}  # fmt: skip
            f.write(json.dumps(row) + "\n")
