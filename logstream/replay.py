"""`logstream replay`: stream a file through the detector as if it were live, then report.

Without `--model` the detector is trained on the input itself:
- `first` (default): train on the first TRAIN_FRACTION of the input, score the rest.
- `all`: prequential. The input is cut into chunks that double in size (`chunk_bounds`:
  the first holds max(MIN_FIRST_CHUNK, n / 16) items, as a tail fit wants a few hundred
  held-out lines, so 2k lines make 2 chunks, 5k lines 4 and 100k lines 5); chunk
  k >= 1 is scored by the model trained on chunks 0..k-1 (each model continues the
  previous one on the newest chunk). Chunk 0 has no past: the model trained on it scores
  it (its held-out lines out of sample, the rest in sample; early stopping on validation
  windows keeps it from memorizing a one-off incident there).

Every chunk's scores are in the one calibrated unit (-log10 p, `scoring`), so they
share one threshold; the report lists each chunk's model, its raw-score threshold and how
many of its items alerted.

Memory does not grow with the input: the file is read again for each pass (a training
chunk, the scoring, the report's texts) instead of held, and each scored unit goes to
`--out` and into bounded summaries (`Tally`: numeric columns for the metrics, groups per
template with their worst and first examples) as it is made. Only `--alerts` keeps one
object per anomaly (the alerts are routed after the scoring).

With `multiline` (the CLI's `--multiline auto`), the lines of a stack trace are joined as
the file is read (`consumers.multiline`): the item is the event, scored once, reported at
its first line with its last beside it (`Unit.last_line`); a labels file still has one
label per line, and an event is anomalous if any of its lines is.

Lines (not sessions) also pass one `quiet.QuietWatch` for the whole input, across the
chunks' models: sources that stopped logging are listed (`quiet_sources`) and, with
`--alerts`, alert as serve's do.
"""

from __future__ import annotations

import dataclasses
import json
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from logstream.alerts.context import LineContext
from logstream.consumers.file import read_file
from logstream.consumers.inputs import (
    InputStats,
    Reread,
    Session,
    check_file,
    compile_stream_key,
    line_parser,
    no_line_to_score,
    read_labels,
    read_records,
    read_sessions,
    streams_from_records,
    streams_from_sessions,
)
from logstream.consumers.multiline import Joined, JoinStats, join_events, joiner_for
from logstream.consumers.parse import RecordParser
from logstream.detector import Detector, ScoredLine
from logstream.evaluation.metrics import auc_pr, auc_roc, best_f1, precision_recall_f1
from logstream.lifecycle.feedback import FeedbackRules, FeedbackStore
from logstream.lifecycle.train import TrainConfig, Trained, train
from logstream.records import Anomaly, LogRecord, Stream
from logstream.report.groups import Grouper, TemplateGroup
from logstream.scoring.quiet import QuietWatch
from logstream.settings import MultilineSettings
from logstream.text.explain import Explanation

TRAIN_FRACTION = 0.5
MIN_FIRST_CHUNK = 1000
# lines per detector call (lines format): enough that each stream's lines fill the engine's
# 256-token steps even when a line is a token or two (docs/benchmarks.md, "Tokens per line")
LINE_BATCH = 4096
SESSION_BATCH = 64  # sessions per detector call (sessions format)
END_OF_SESSION = "<end of stream>"  # a session unit's text when its end scored worst (Detector.close)
T = TypeVar("T")


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
    alerts: bool = False  # keep the anomalies, as serve hands them off (`ReplayReport.anomalies`)
    quiet_sources: bool = True  # watch for sources that stop logging (serve's `quiet_sources`)
    # multi-line events (stack traces) joined into one record (`consumers.multiline`); the
    # CLI's default is auto, this library's off (the benchmarks replay lines as they are)
    multiline: MultilineSettings = field(default_factory=MultilineSettings)
    feedback: Path | None = None  # a feedback database whose verdicts every part's detector obeys


@dataclass(slots=True)
class Unit:
    """What is scored and evaluated: a line (lines format) or a session (sessions format),
    built on the detector's `ScoredLine` (a session: its most surprising line) with what replay
    adds: its label, place in the file and model, and the anomaly serve would hand off.

    Made per scored item and dropped once counted (`Tally`); only a bounded number is kept
    (the examples of `groups.Grouper`)."""

    scored: ScoredLine  # the line as scored (a session: its worst line, or its end)
    score: float  # calibrated, -log10 p: the line's, or the session's
    label: int | None
    index: int = 0  # item number (lines or sessions read), 0-based; labels are indexed by it
    chunk: int = 0  # which model scored it (prequential replay)
    line: int = 0  # 1-based line number in the input file, as an editor counts (empty lines too)
    last_line: int = 0  # a multi-line event's last line (else `line`)
    new_words: tuple[str, ...] = ()  # explained words no earlier line of its stream had (`groups`)
    anomaly: Anomaly | None = None  # what serve would hand to the alerts (Detector.anomaly)
    at: int = 0  # sessions: which of the session's lines `text` is (-1: the session's end)

    @property
    def stream(self) -> str:
        return self.scored.record.stream

    @property
    def text(self) -> str:
        """The line, or the session's most surprising line."""
        return self.scored.record.line

    @property
    def threshold(self) -> float:
        return self.scored.threshold

    @property
    def surprisal(self) -> float:
        return self.scored.surprisal

    @property
    def level(self) -> str | None:
        return self.scored.level

    @property
    def novel(self) -> bool:
        return self.scored.novel

    @property
    def template(self) -> str | None:
        return self.scored.template

    @property
    def explanation(self) -> Explanation | None:
        return self.scored.explanation

    @property
    def event_time(self) -> float | None:
        """The log's own time at the start of the line, if it has one."""
        return self.scored.record.timestamp

    @property
    def is_anomaly(self) -> bool:
        return self.anomaly is not None


# A chunk whose model never saw that period (Spark_2k's first chunk scored by the second
# chunk's model) alerts on 8.8% of its items; ordinary chunks of the loghub samples on under 1%
UNEXPLAINED_ALERT_SHARE = 0.05


@dataclass(frozen=True)
class ChunkModel:
    """One model of a replay and what it scored: its thresholds, stated truthfully."""

    first: int  # first scored item (0-based)
    items: int
    train_lines: int
    train_steps: int
    window: int
    threshold: float  # -log10 p: the same for every chunk
    raw_threshold: float  # the surprisal (nats) that this chunk's threshold is for a line without a level
    anomalies: int = 0  # its items over the threshold: a model that never saw this period shows here
    model_id: str = ""  # as alerts carry it: the model dir's name (or auto-train) @ data hash
    model_version: str = ""  # when the model was trained

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @property
    def alerts_beyond_chance(self) -> bool:
        """More than UNEXPLAINED_ALERT_SHARE of its items alert, where the threshold expects about
        10^-threshold of normal ones: a large incident, or a period the model never saw (a job's
        other phase). The report says so; no score changes."""
        return self.anomalies > UNEXPLAINED_ALERT_SHARE * self.items


class Columns:
    """Per scored item, the numbers the metrics and the timeline need, in compact arrays: 50
    bytes an item and no text, so 200k lines keep 10 MB here. Scores
    stay float64 so that the metrics are those of the scores themselves."""

    def __init__(self) -> None:
        self.score, self.threshold = array("d"), array("d")
        self.label = array("b")  # -1: no label
        self.alert = array("b")  # 1: it alerted (over the threshold, or an operator's "anomaly")
        self.index, self.line, self.last_line = array("q"), array("q"), array("q")
        self.stream = array("i")  # number in `streams`
        self.at = array("i")  # Unit.at
        self.streams: dict[str, int] = {}  # stream name -> number, in order of first item

    def add(self, u: Unit) -> None:
        self.score.append(u.score)
        self.threshold.append(u.threshold)
        self.label.append(-1 if u.label is None else u.label)
        self.alert.append(u.is_anomaly)
        self.index.append(u.index)
        self.line.append(u.line)
        self.last_line.append(u.last_line or u.line)
        self.stream.append(self.streams.setdefault(u.stream, len(self.streams)))
        self.at.append(u.at)

    def __len__(self) -> int:
        return len(self.score)

    def numpy(self, name: str) -> np.ndarray:
        """A column as a numpy array (a copy: the array stays appendable)."""
        return np.array(getattr(self, name))

    def scores(self) -> np.ndarray:
        return self.numpy("score")

    def flagged(self) -> np.ndarray:
        """Whether each item alerted."""
        return self.numpy("alert").astype(bool)

    def labels(self) -> np.ndarray | None:
        """The items' labels, or None unless every item has one."""
        y = self.numpy("label").astype(np.int64)
        return y if len(y) and bool((y >= 0).all()) else None


@dataclass
class ReplayReport:
    columns: Columns  # every scored item's numbers
    patterns: list[TemplateGroup]  # every item grouped by template (`groups.Grouper`)
    lines: int
    streams: int
    threshold: float
    seconds: float
    peak_cache_bytes: int
    bad_input: dict[str, int]
    unit: str  # "line" | "session"
    chunks: list[ChunkModel] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)  # with ReplayOptions.alerts, in order
    quiet: list[ScoredLine] = field(
        default_factory=list
    )  # sources that stopped logging (logstream.scoring.quiet)
    trained_on_lines: tuple[int, int] | None = None  # auto-train first: the file lines that trained it
    joins: JoinStats = field(default_factory=JoinStats)  # multi-line events joined

    @property
    def scored_lines(self) -> tuple[int, int]:
        """The first and last file line (1-based) of the scored items; (0, 0) when none."""
        line = self.columns.line
        return (min(line), max(self.columns.last_line)) if len(line) else (0, 0)

    @property
    def worst(self) -> tuple[float, int] | None:
        """The highest score of the replay and its file line (the first such), None when none."""
        if not len(self.columns):
            return None
        scores = self.columns.scores()
        at = int(np.argmax(scores))
        return float(scores[at]), int(self.columns.line[at])

    def summary(self) -> dict[str, Any]:
        scores, flagged = self.columns.scores(), self.columns.flagged()
        worst = self.worst
        out: dict[str, Any] = {
            "lines": self.lines,
            "streams": self.streams,
            "unit": self.unit,
            "scored": len(self.columns),
            "scored_lines": list(self.scored_lines),
            "trained_on_lines": list(self.trained_on_lines) if self.trained_on_lines else None,
            "anomalies": int((flagged > 0).sum()),
            "threshold": round(self.threshold, 4),
            "max_score": round(worst[0], 4) if worst else None,
            "max_score_line": worst[1] if worst else None,
            "score_unit": "-log10 p",
            "false_alarms_per_1000": None,
            "chunks": [c.to_json() for c in self.chunks],
            "lines_per_second": round(self.lines / self.seconds, 1) if self.seconds else None,
            "peak_cache_bytes": self.peak_cache_bytes,
            "bad_input": self.bad_input,
            "multiline": self.joins.as_dict(),
            "quiet_sources": [quiet_json(q) for q in self.quiet],
        }
        y = self.columns.labels()
        if y is not None:
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


class Tally:
    """Takes each scored unit as it is made and keeps only bounded summaries: the numbers
    (`Columns`), the groups (`Grouper`), the stream names; writes the `--out` row; with
    `alerts`, the anomalies with the lines around them (`LineContext.follow`)."""

    def __init__(self, out: IO[str] | None, alerts: bool, lines: bool, quiet_sources: bool = True) -> None:
        self.columns, self.grouper, self.out = Columns(), Grouper(), out
        self.alerts, self.lines = alerts, lines
        self.context = LineContext()
        self.anomalies: list[Anomaly] = []
        self.latest: float | None = None  # the log's latest time so far
        self.now = time.time()  # the time of a log without any
        self.stream_names: set[str] = set()
        self.scored_lines = 0
        self.chunk_anomalies: Counter[int] = Counter()  # chunk -> its units over the threshold
        # one watch for the whole input, across the chunks' models
        self.watch = QuietWatch() if quiet_sources else None
        self.quiet: list[ScoredLine] = []  # at most one per silence of a source

    def add(self, u: Unit) -> None:
        self.columns.add(u)
        self.chunk_anomalies[u.chunk] += u.is_anomaly
        self.grouper.add(u)
        if self.out is not None:
            self.out.write(json.dumps(_row(u)) + "\n")
        if self.alerts:
            self._alert(u)

    def add_quiet(self, quiet: ScoredLine, anomaly: Anomaly | None) -> None:
        """A source that stopped logging (`Detector.quiet_sources`), noticed at the log's time."""
        self.quiet.append(quiet)
        if self.alerts and anomaly is not None:
            self.anomalies.append(dataclasses.replace(anomaly, detected_at=quiet.record.timestamp))

    def _alert(self, u: Unit) -> None:
        """As serve would hand it off; detected at the log's own time where the line (or one
        before it) has one, and with the stream's lines around it (the file has those after)."""
        self.latest = u.event_time if u.event_time is not None else self.latest
        anomaly = u.anomaly
        if anomaly is not None:
            detected = self.latest if self.latest is not None else self.now
            anomaly = dataclasses.replace(anomaly, detected_at=detected)
        if self.lines:
            self.anomalies += self.context.follow(u.stream, u.text, anomaly)
        elif anomaly is not None:
            self.anomalies.append(anomaly)

    def finish(self) -> None:
        if self.alerts and self.lines:
            self.anomalies += self.context.finish()


def _row(u: Unit) -> dict[str, Any]:
    """The `--out` row: `line` (to `last_line`, a multi-line event) is 1-based in the input
    file, `index` the 0-based item."""
    return {"line": u.line, "last_line": u.last_line or u.line, "index": u.index, "stream": u.stream, "score": round(u.score, 4),
            "threshold": round(u.threshold, 4), "anomaly": u.is_anomaly,
            "surprisal": round(u.surprisal, 4), "burst": round(u.scored.burst, 4), "rarity": round(u.scored.rarity, 4), "level": u.level, "novel": u.novel, "chunk": u.chunk, "label": u.label, "template": u.template, "text": u.text,
            "explanation": u.explanation.to_json() if u.explanation else None}  # fmt: skip


def quiet_json(quiet: ScoredLine) -> dict[str, Any]:
    """A quiet source in the summary: `line` is the 1-based line that showed it, `text` says which."""
    record = quiet.record
    return {"line": record.offset + 1 if record.offset is not None else None, "stream": record.stream,
            "score": round(quiet.score, 4), "threshold": round(quiet.threshold, 4),
            "silent_seconds": round(quiet.surprisal, 1), "template": quiet.template, "text": record.line}  # fmt: skip


def _batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


class _Scorer:
    """Drives one chunk's detector over records or sessions, as serve drives it; hands each
    unit to the tally as it is made and keeps none."""

    def __init__(self, detector: Detector, chunk: int, tally: Tally, tick: Callable[[int], None]) -> None:
        self.detector, self.chunk, self.tally, self.tick = detector, chunk, tally, tick

    def lines(
        self, records: Iterable[LogRecord], first_index: int, labels: Sequence[int] | np.ndarray | None
    ) -> None:
        streams: set[str] = set()
        i = first_index
        for batch in _batched(records, LINE_BATCH):
            step = self.detector.step(batch, self.tally.watch)
            for scored in step.lines:
                record = scored.record
                line = record.offset + 1 if record.offset is not None else i + 1
                label = int(labels[i]) if labels is not None else None
                unit = self._unit(scored, scored, label, i, line)
                unit.last_line = record.last_offset + 1 if record.last_offset is not None else line
                self.tally.add(unit)
                i += 1
            for quiet in step.quiet:
                self.tally.add_quiet(quiet, self.detector.anomaly(quiet))
            streams.update(r.stream for r in batch)
            self.tally.scored_lines += len(batch)
            self.tick(len(batch))
        for stream in streams:
            self.detector.close(stream)
        self.tally.stream_names |= streams

    def sessions(self, sessions: Iterable[Session], first_index: int, numbers: Sequence[int]) -> None:
        index = first_index
        for batch in _batched(sessions, SESSION_BATCH):
            scored = self.detector.score_streams(streams_from_sessions(batch))
            for session, result in zip(batch, scored, strict=True):
                if result.worst is not None:  # the session alert: its worst line, the session's score
                    unit = self._unit(result.worst, result.scored, session.label, index, numbers[index])
                    unit.at = _line_at(session, result.worst)
                    self.tally.add(unit)
                index += 1
            self.tally.stream_names.update(s.id for s in batch)
            self.tally.scored_lines += sum(len(s.lines) for s in batch)
            self.tick(sum(len(s.lines) for s in batch))

    def _unit(self, scored: ScoredLine, unit: ScoredLine, label: int | None, index: int, line: int) -> Unit:
        """`scored`: the line as scored; `unit`: the same carrying the unit's (session's) score."""
        return Unit(
            scored,
            unit.score,
            label,
            index=index,
            chunk=self.chunk,
            line=line,
            anomaly=self.detector.anomaly(unit),
        )


def _line_at(session: Session, worst: ScoredLine) -> int:
    """Which of the session's lines is its worst (-1: its end), to read the text again later."""
    line = worst.record.line
    return session.lines.index(line) if worst.kind == "line" and line in session.lines else -1


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
    """The validated input: records (lines format, as serve's parser made them) or sessions.

    A log file is not held in memory: `source` reads its records again for each pass (a
    training chunk, the scoring, the report's texts). Sessions, and items made by a caller,
    are in `items`."""

    items: list[Any]  # LogRecord or Session; empty when `source` reads them
    labels: Sequence[int] | np.ndarray | None  # 0/1 per item (lines format)
    stats: InputStats
    detector: Detector | None  # loaded from --model, else trained during the replay
    numbers: Sequence[int] = ()  # sessions: each one's 1-based line in the file
    source: Callable[[], Iterator[LogRecord]] | None = None  # the file's records, read again
    count: int = 0  # items (with `source`: counted when the input was checked)
    joins: JoinStats = field(default_factory=JoinStats)  # multi-line events (counted with `count`)

    def __post_init__(self) -> None:
        self.count = self.count or len(self.items)
        if not self.numbers:  # items not read from a file: number them 1..n
            self.numbers = range(1, self.count + 1)

    def read(self, start: int = 0) -> Iterator[Any]:
        """The items from `start` on, in order."""
        return islice(self.source() if self.source is not None else self.items, start, None)

    def slice(self, start: int, stop: int) -> list[Any]:
        return list(islice(self.read(start), stop - start))


def load_replay_input(options: ReplayOptions) -> ReplayInput:
    """Read and check input and model before any work starts; raises InputError/ModelDirError."""
    stats = InputStats()
    compile_stream_key(options.stream_key)  # a bad --stream-key fails before any work
    check_file(options.input)
    detector = Detector.load(options.model, **_sensitivity(options)) if options.model is not None else None
    if options.format == "sessions":
        numbers: list[int] = []
        sessions = read_sessions(options.input, stats, numbers)
        return ReplayInput(sessions, None, stats, detector, numbers)
    # without --stream-key, the streams the model was trained on (a forgotten key would put
    # every line into one `default` stream)
    saved = detector.meta.get("stream_key") if detector is not None else None
    parser = line_parser(options.stream_key or saved, multiline=options.multiline)
    # the count, and the bad input once only; no event times, which only scoring reads
    joins = JoinStats()
    count = lines = 0
    for joined in _events(options.input, parser, stats, joins):
        count += 1
        lines += len(joined.members)
    if not count:
        raise no_line_to_score(options.input, stats)
    labels = None
    if options.labels is not None:
        by_line = np.array(read_labels(options.labels, lines), dtype=np.int8)
        # a multi-line event is anomalous if any of its lines is
        labels = by_line if lines == count else _event_labels(options.input, parser, by_line)
    return ReplayInput(
        [],
        labels,
        stats,
        detector,
        source=lambda: read_records(options.input, Reread(), parser),
        count=count,
        joins=joins,
    )


def _events(
    path: Path, parser: RecordParser, stats: InputStats, joins: JoinStats | None = None
) -> Iterator[Joined]:
    """The file's records as joined, each with the numbers of its lines (no event times)."""
    return join_events(read_file(path, parser, stats), joiner_for(parser.settings, joins))


def _event_labels(path: Path, parser: RecordParser, by_line: np.ndarray) -> np.ndarray:
    """One label per joined record: the highest of its lines' labels."""
    return np.array([by_line[list(j.members)].max() for j in _events(path, parser, Reread())], dtype=np.int8)


def _sensitivity(options: ReplayOptions) -> dict[str, Any]:
    """The detector options of every part: sensitivity, and the operators' verdicts."""
    rules = FeedbackRules(FeedbackStore(options.feedback)) if options.feedback is not None else None
    return {"false_alarm_rate": options.false_alarm_rate, "threshold": options.threshold, "rules": rules}


@dataclass
class Part:
    """Items [first, first + count) scored by one model, and the items [start, stop) it was
    trained on (None: --model)."""

    first: int
    count: int
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
    return trained, _detector(trained, options)


def _detector(trained: Trained, options: ReplayOptions) -> Detector:
    model_id = f"replay-auto-train@{trained.meta.get('data_sha256', '')[:12]}"
    return Detector(
        trained.model, trained.tokenizer, trained.meta, model_id=model_id, **_sensitivity(options)
    )


def train_parts(
    options: ReplayOptions, data: ReplayInput, progress: ReplayProgress | None = None
) -> list[Part]:
    """The models of a replay: --model, or trained on the input (`first` or prequential `all`)."""
    progress = progress or ReplayProgress()
    n_items = data.count
    if data.detector is not None:
        return [Part(0, n_items, data.detector)]
    if options.auto_train == "first":
        cut = int(n_items * TRAIN_FRACTION)
        baseline = to_streams(options, data, data.slice(0, cut))
        _, detector = _train_part(baseline, options, progress, f"on the first half ({cut:,} items)", None)
        return [Part(cut, n_items - cut, detector, (0, cut))]
    bounds = chunk_bounds(n_items)
    n = len(bounds) - 1
    parts: list[Part] = []
    trained = None
    for k in range(1, n):
        baseline = to_streams(options, data, data.slice(bounds[k - 1], bounds[k]))
        what = f"model {k}/{n - 1} on chunk {k - 1}" + (" (continued)" if trained else "")
        trained, detector = _train_part(baseline, options, progress, what, trained)
        if k == 1:  # the first chunk has no past: its own model scores it, with a state of its own
            parts.append(Part(0, bounds[1], _detector(trained, options), (0, bounds[1])))
        parts.append(Part(bounds[k], bounds[k + 1] - bounds[k], detector, (bounds[k - 1], bounds[k])))
    return parts


def run_replay(
    options: ReplayOptions, data: ReplayInput, progress: ReplayProgress | None = None
) -> ReplayReport:
    """Score the input as if it were live; train on it first when no model is given."""
    return score_parts(options, data, train_parts(options, data, progress), progress)


def score_parts(
    options: ReplayOptions, data: ReplayInput, parts: list[Part], progress: ReplayProgress | None = None
) -> ReplayReport:
    """Stream each part through its detector, in order, and report. Each unit is counted and
    written to `--out` as it is scored, then dropped: memory does not grow with the lines."""
    progress = progress or ReplayProgress()
    started = time.perf_counter()
    sessions = options.format == "sessions"
    if sessions:  # the bar counts what it scores: these parts' lines
        total = sum(len(s.lines) for p in parts for s in data.items[p.first : p.first + p.count])
    else:
        total = sum(p.count for p in parts)
    progress.phase("scoring lines", total)
    with ExitStack() as stack:
        out = stack.enter_context(options.out.open("w", encoding="utf-8")) if options.out else None
        tally = Tally(out, options.alerts, lines=not sessions, quiet_sources=options.quiet_sources)
        for k, part in enumerate(parts):
            scorer = _Scorer(part.detector, k, tally, lambda n: progress.advance(n, ""))
            items = islice(data.read(part.first), part.count)
            if sessions:
                scorer.sessions(items, part.first, data.numbers)
            else:
                scorer.lines(items, part.first, data.labels)
        tally.finish()
    report = ReplayReport(
        columns=tally.columns, patterns=tally.grouper.groups(), lines=tally.scored_lines,
        streams=len(tally.stream_names), threshold=parts[-1].detector.threshold,
        seconds=time.perf_counter() - started,
        peak_cache_bytes=max(part.detector.peak_cache_bytes for part in parts), bad_input=data.stats.as_dict(),
        unit="session" if sessions else "line",
        chunks=[_chunk_model(part, tally.chunk_anomalies[k]) for k, part in enumerate(parts)],
        anomalies=tally.anomalies, quiet=tally.quiet, joins=data.joins,
    )  # fmt: skip
    if len(parts) == 1 and parts[0].trained_on is not None and len(tally.columns):
        report.trained_on_lines = (1, report.scored_lines[0] - 1)  # auto-train first: the lines before
    return report


def plan(options: ReplayOptions, data: ReplayInput, model: str = "") -> str:
    """What the replay is about to do, in one paragraph for stderr: which lines train a model,
    which are scored, and how to score them all."""
    n = data.count
    first, _ = _line_span(data, 0)
    _, last = _line_span(data, n - 1)
    if data.detector is not None:
        return f"replay: scoring every line ({first:,}-{last:,}) with the model {model or data.detector.model_id}"
    if options.auto_train == "first":
        cut, _ = _line_span(data, int(n * TRAIN_FRACTION))
        return (
            f"replay: no --model, so lines {first:,}-{cut - 1:,} (the first half) train a model and "
            f"lines {cut:,}-{last:,} are scored; the first half is not scored. To score every line: "
            "--auto-train all (each part by a model trained on the lines before it), or --model DIR "
            "(a model trained on other logs: logstream train)."
        )
    end, _ = _line_span(data, chunk_bounds(n)[1])
    return (
        f"replay: no --model, --auto-train all: every line is scored; lines {first:,}-{end - 1:,} "
        "train the first model, which scores them too, and each later part is scored by a model "
        "trained on the lines before it."
    )


def _line_span(data: ReplayInput, index: int) -> tuple[int, int]:
    """The first and last file line (1-based) of item `index`."""
    if data.source is None:
        return data.numbers[index], data.numbers[index]
    record = next(data.read(index))
    if record.offset is None:
        return index + 1, index + 1
    return record.offset + 1, (record.last_offset if record.last_offset is not None else record.offset) + 1


def unit_texts(data: ReplayInput, columns: Columns) -> Iterator[tuple[int, str, str]]:
    """(line, stream, text) of each scored unit, in order, read again from the input (a
    session's text: its line the unit names, or its end)."""
    if not len(columns):
        return
    names = list(columns.streams)
    items = enumerate(data.read(columns.index[0]), start=columns.index[0])
    for k, wanted in enumerate(columns.index):
        i, item = next(items)
        while i < wanted:
            i, item = next(items)
        if isinstance(item, LogRecord):
            text = item.line
        else:
            text = item.lines[columns.at[k]] if columns.at[k] >= 0 else END_OF_SESSION
        yield columns.line[k], names[columns.stream[k]], text


def _chunk_model(part: Part, anomalies: int) -> ChunkModel:
    detector = part.detector
    online = detector.scorer.online
    line_tail = online.fit if online is not None else detector.calibration.line
    rate = 10**-detector.threshold
    return ChunkModel(
        first=part.first, items=part.count, anomalies=anomalies, train_lines=detector.meta.get("train_lines", 0),
        train_steps=detector.meta.get("train_steps", 0), window=detector.engine.window,
        threshold=detector.threshold,
        raw_threshold=line_tail.raw_threshold(rate) if line_tail is not None else detector.threshold,
        model_id=detector.model_id, model_version=str(detector.meta.get("created_at", "")),
    )  # fmt: skip
