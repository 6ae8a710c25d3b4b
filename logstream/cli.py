"""logstream: anomaly detection on logs with a small language model.

Commands: train (a model on normal logs), replay (backtest a file), tail (follow files or
stdin live), serve (live from Kafka), demo (the embedded example); alerts (routes, delivery,
silences), feedback (mark alerts normal or confirmed), models (versions: add, list, promote,
rollback) and incidents (past incidents: search, show, resolve) have subcommands.

Errors a user can fix are one line on stderr and exit code 2, never a traceback.
"""

# torch and transformers load only inside the commands that need them (local imports below),
# so `--help` and `--version` answer at once; tests/test_cli.py checks that --help never loads them.

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from logstream import __version__
from logstream.alerts.cli import app as alerts_app
from logstream.demo import write_demo_logs
from logstream.errors import UserError
from logstream.evaluation.synth import STREAM_KEY
from logstream.lifecycle.feedback_cli import app as feedback_app
from logstream.lifecycle.models_cli import app as models_app
from logstream.memory.cli import app as incidents_app
from logstream.scoring.config import DEFAULT_FALSE_ALARM_RATE
from logstream.scoring.evidence import LINE_TOP_K, SESSION_TOP_K
from logstream.text.printable import printable

if TYPE_CHECKING:
    from logstream.alerts.alert import Alert
    from logstream.alerts.config import AlertsConfig
    from logstream.lifecycle.feedback import FeedbackRules
    from logstream.lifecycle.train import TrainConfig
    from logstream.replay import ChunkModel, ReplayReport, Unit
    from logstream.report.groups import TemplateGroup

# Hugging Face and tqdm progress bars ("Loading weights", "Writing model shards") would mix
# with ours on stderr; set before transformers is first imported.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

PRESET_NAMES = (
    "tiny",
    "small",
    "base",
)  # logstream.engine.model.PRESETS (imports torch; a test keeps them equal)

# the help shows a docstring's line breaks as they are: one line per paragraph
HELP = "\n\n".join(" ".join(paragraph.split()) for paragraph in (__doc__ or "").split("\n\n"))
app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP, pretty_exceptions_enable=False)
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"logstream {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    import structlog

    # log lines (a bad input line skipped, a delivery retried) go to stderr: stdout is each
    # command's output (anomalies, --json); serve configures its own logging

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


class Format(StrEnum):
    lines = "lines"
    sessions = "sessions"


class AutoTrain(StrEnum):
    first = "first"
    all = "all"


def _console(stderr: bool) -> Console:
    """A console for tables: the terminal's width, or 160 columns into a file or a pipe."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def fail(message: str) -> typer.Exit:
    sys.stderr.write(f"error: {printable(message)}\n")
    return typer.Exit(2)


def _progress(disable: bool = False) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"), console=err, disable=disable, transient=False,
    )  # fmt: skip


PresetOpt = Annotated[
    str,
    typer.Option(
        help=f"Model size: auto (tiny below 50,000 baseline lines, else small), {', '.join(PRESET_NAMES)}."
    ),
]
WindowOpt = Annotated[
    int | None,
    typer.Option(
        min=16,
        help="Rolling window L: ring slots per stream. Default: 2048, or less when the baseline is "
        "too small to fill it 64 times.",
    ),
]
MultilineOpt = Annotated[
    str,
    typer.Option(
        help="Join the lines of one event (a stack trace) into one record: auto (Java and Python "
        "traces, indented lines), off, start:REGEX (an event starts at each matching line) or "
        "continue:REGEX (a matching line continues the one before); RE2 regexes.",
    ),
]
MergeAcrossWordsOpt = Annotated[
    bool,
    typer.Option(
        help="Let the tokenizer's merges cross spaces: a common line becomes one token, several times "
        "faster, at a cost in quality on raw logs (docs/benchmarks.md, Tokens per line).",
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Random seed for training.")]
StepsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Upper bound on optimizer steps; training stops earlier once the validation loss stops improving.",
    ),
]
RateOpt = Annotated[
    float | None,
    typer.Option(
        min=1e-9, max=0.5,
        help="Sensitivity: the share of normal lines allowed to alert (threshold = -log10 of it). "
        f"Lower is quieter. Default: the model's ({DEFAULT_FALSE_ALARM_RATE:g}).",
    ),
]  # fmt: skip
ThresholdOpt = Annotated[
    float | None,
    typer.Option(min=0.0, help="Alert above this score (-log10 p); overrides --false-alarm-rate."),
]
FeedbackDbOpt = Annotated[
    Path | None,
    typer.Option(
        "--feedback",
        help="Feedback database (the alert outbox, or feedback.database): obey operators' verdicts as "
        "serve does: a template marked normal never alerts, one confirmed as an anomaly always does.",
    ),
]
QuietSourcesOpt = Annotated[
    bool,
    typer.Option(
        "--quiet-sources/--no-quiet-sources",
        help="Watch for sources (syslog programs, log4j loggers) that stop logging, as serve's quiet_sources does.",
    ),
]
StreamKeyOpt = Annotated[
    str | None,
    typer.Option(help=r"Regex whose first group (or match) names a line's stream, e.g. 'blk_-?\d+'."),
]
FormatOpt = Annotated[
    Format, typer.Option("--format", help="lines: one log line per line; sessions: JSONL sessions.")
]


def _train_config(
    preset: str, window: int | None, seed: int, max_steps: int,
    line_top_k: int | None = None, false_alarm_rate: float | None = None,
    stream_key: str | None = None, merge_across_words: bool = False, sessions: bool = False,
) -> TrainConfig:  # fmt: skip
    from logstream.lifecycle.train import TrainConfig
    from logstream.scoring.config import ScoringConfig

    if preset != "auto" and preset not in PRESET_NAMES:
        raise fail(f"--preset: unknown {preset!r}; expected auto, {', '.join(PRESET_NAMES)}")
    if line_top_k is None:
        line_top_k = SESSION_TOP_K if sessions else LINE_TOP_K
    scoring = ScoringConfig(
        line_top_k=line_top_k, false_alarm_rate=false_alarm_rate or DEFAULT_FALSE_ALARM_RATE
    )
    return TrainConfig(
        preset=preset, window=window or TrainConfig.window, fit_window=window is None, seed=seed,
        max_steps=max_steps, scoring=scoring,
        stream_key=stream_key, merge_across_words=merge_across_words,
    )  # fmt: skip


def check_out_file(path: Path | None, option: str) -> None:
    """Fail before any work when an output file cannot be written there."""
    if path is None:
        return
    if path.is_dir():
        raise fail(f"{option}: {path} is a directory; give a file path")
    if not path.parent.is_dir():
        raise fail(f"{option}: folder {path.parent} does not exist")


def check_paths(inputs: list[Path], model: Path | None) -> Path | None:
    """Fail on a missing or unusable input file or model in a fraction of a second: before
    the command imports torch and transformers, which take seconds. Returns the model
    directory (`model_dir`)."""
    from logstream.consumers.inputs import check_file

    for path in inputs:
        check_file(path)
    return model_dir(model) if model is not None else None


def is_store(path: Path) -> bool:
    """A model store (logstream.lifecycle.model_store): `versions/` and no model of its own."""
    from logstream.engine.metadata import META_FILE
    from logstream.lifecycle.model_store import VERSIONS

    return (path / VERSIONS).is_dir() and not (path / META_FILE).exists()


def model_dir(path: Path) -> Path:
    """A model directory, or a model store's live version (what serve scores with), checked
    without torch; a ModelDirError or StoreError names what is wrong and the fix."""
    from logstream.engine.metadata import read_model_meta
    from logstream.lifecycle.model_store import live_dir

    directory = live_dir(path) if is_store(path) else path
    read_model_meta(directory)
    return directory


def check_out_dir(path: Path, option: str) -> None:
    """A model directory: new (parents are created), or an existing directory; never a file."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise fail(f"{option}: {part} exists and is not a directory")


@app.command("train")
def train_command(
    inputs: Annotated[list[Path], typer.Argument(help="Baseline log files (normal behaviour).")],
    out: Annotated[Path, typer.Option(help="Model directory to write.")],
    format: FormatOpt = Format.lines,
    only_normal: Annotated[bool, typer.Option(help="sessions format: keep only label-0 sessions.")] = False,
    preset: PresetOpt = "auto",
    window: WindowOpt = None,
    seed: SeedOpt = 0,
    max_steps: StepsOpt = 2000,
    merge_across_words: MergeAcrossWordsOpt = False,
    stream_key: StreamKeyOpt = None,
    false_alarm_rate: RateOpt = None,
    line_top_k: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Line score: mean surprisal of the line's k most surprising words (0: all of them). "
            f"Default: {LINE_TOP_K}, and {SESSION_TOP_K} (all) for --format sessions.",
        ),
    ] = None,
    from_model: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="Continue this model (a model directory, or a model store's live version) on the "
            "inputs, plus its kept sample of old data and --feedback.",
        ),
    ] = None,
    feedback: Annotated[
        Path | None,
        typer.Option(help="With --from: feedback database (outbox) whose lines marked normal it learns."),
    ] = None,
    prompt_only: Annotated[
        bool,
        typer.Option(
            help="With --from: no training; the same weights with the pattern prompt (the attention "
            "sinks) rebuilt from the inputs' common templates, calibrated on them (dynamic sinks)."
        ),
    ] = False,
    multiline: MultilineOpt = "auto",
) -> None:
    """Train a detector on baseline logs and write a model directory (HF checkpoint + logstream.json)."""
    from_model = check_paths(inputs, from_model)
    from logstream.consumers.inputs import (
        InputStats,
        line_parser,
        multiline_option,
        read_records,
        read_sessions,
        streams_from_records,
        streams_from_sessions,
    )
    from logstream.lifecycle.retrain import continue_training, read_sample, refresh_prompt, write_sample
    from logstream.lifecycle.train import save, train

    if feedback is not None and from_model is None:
        raise fail("--feedback needs --from MODEL (a fresh model learns from the inputs only)")
    if prompt_only and (from_model is None or feedback is not None):
        raise fail("--prompt-only needs --from MODEL and no --feedback (it changes no weights)")
    config = _train_config(
        preset, window, seed, max_steps, line_top_k, false_alarm_rate,
        stream_key if format is Format.lines else None, merge_across_words,
        sessions=format is Format.sessions,
    )  # fmt: skip
    check_out_dir(out, "--out")
    if only_normal and format is not Format.sessions:
        raise fail("--only-normal needs --format sessions (labels live in the sessions)")
    parser = line_parser(stream_key, multiline=multiline_option(multiline))
    stats = InputStats()
    streams = []
    for path in inputs:
        if format is Format.sessions:
            sessions = read_sessions(path, stats)
            streams += streams_from_sessions([s for s in sessions if not only_normal or s.label == 0])
        else:
            streams += streams_from_records(read_records(path, stats, parser))
    with _progress() as progress:
        task = progress.add_task("training", total=None, info="")

        def advance(step: int, steps: int, loss: float) -> None:
            progress.update(task, completed=step, total=steps, info=f"loss {loss:.3f}")

        if from_model is None:
            trained = train(streams, config, progress=advance)
        elif prompt_only:
            trained = refresh_prompt(from_model, streams, config)
            streams = read_sample(from_model)  # the weights still know only the parent's data
        else:
            trained, streams = continue_training(
                from_model, streams, config, feedback_db=feedback, progress=advance
            )
    save(trained, out)
    write_sample(out, streams)  # what a model continued from this one replays
    err.print(
        train_summary(out, trained.meta) + (f", skipped {stats.as_dict()}" if stats.bad else ""),
        highlight=False,
    )


def train_summary(out: Path, meta: dict) -> str:
    """What training did, in one line: data, schedule, loss, calibration."""
    calibration = meta["calibration"]
    rate = calibration["config"]["false_alarm_rate"]
    return (
        f"wrote {out}: trained on {meta['train_lines']} lines ({meta['train_tokens']} tokens, window "
        f"{meta['window']}), {meta['train_steps']} steps = {meta['train_epochs']} epochs (kept step {meta['train_best_step']}), final loss "
        f"{meta['final_loss']:.3f}; calibrated on {calibration['heldout_lines']} held-out lines"
        + (f" and {calibration['heldout_sessions']} sessions" if calibration["heldout_sessions"] else "")
        + f"; alerts above score {-math.log10(rate):.2f} (false-alarm rate {rate:g})"
        + f"; data {meta['data_sha256'][:12]}"
        + (f"; rhythms of {len(meta['quiet_baseline'])} sources kept" if meta.get("quiet_baseline") else "")
        + (
            f"; pattern prompt rebuilt from {meta['new_lines']} new lines on the weights of {meta['parent']}"
            if meta.get("prompt_refreshed")
            else f"; continued from {meta['parent']}: {meta['new_lines']} new, {meta['feedback_lines']} "
            f"feedback, {meta['replayed_lines']} replayed lines, {log_time_span(meta['data_window'])}"
            if meta.get("parent")
            else ""
        )
    )


def log_time_span(window: dict[str, float] | None) -> str:
    """The new data's log times (`retrain.data_window`) as a person reads them, in UTC."""
    if not window:
        return "no log times in the new lines"

    def when(seconds: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))

    return f"log time {when(window['first'])} to {when(window['last'])} UTC"


def beyond_chance_note(chunk: ChunkModel) -> str:
    """What a chunk with more alerts than its false-alarm rate explains may be, and how to tell."""
    expected = chunk.items * 10**-chunk.threshold
    return (
        f"note: items {chunk.first + 1}-{chunk.first + chunk.items}: {chunk.anomalies:,} of {chunk.items:,} "
        f"over the threshold, which expects {expected:.1f} of normal ones: an incident that large, or lines "
        "its model never learned (a period it never saw). The groups below say which; a replay with a "
        "baseline of the same period (--model) tells them apart."
    )


def print_report(report: ReplayReport, groups: list[TemplateGroup], console: Console, top: int = 10) -> None:
    """The replay for a person: each model's threshold, then the anomalies grouped by template."""
    if len(report.chunks) > 1:
        chunks = Table(title="models of this replay (scores share one unit: -log10 p)")
        for column in (
            "scored items",
            "trained on lines",
            "steps",
            "window",
            "threshold",
            "surprisal threshold (nats)",
            "anomalies",
        ):
            chunks.add_column(column)
        for c in report.chunks:
            chunks.add_row(
                f"{c.first + 1}-{c.first + c.items}", str(c.train_lines), str(c.train_steps), str(c.window),
                f"{c.threshold:.2f}", f"{c.raw_threshold:.2f}", str(c.anomalies),
            )  # fmt: skip
        console.print(chunks)
    for c in report.chunks:
        if c.alerts_beyond_chance:
            console.print(beyond_chance_note(c))
    flagged = sum(g.count for g in groups)
    table = Table(
        title=f"anomalies by template: {flagged} {report.unit}s over threshold {report.threshold:.2f} in "
        f"{len(groups)} groups (score = -log10 p of a normal {report.unit} scoring this high; "
        "lines are 1-based in the file)"
    )
    for column in (
        "worst",
        "count",
        "lines",
        "stream",
        "example: the line's template, surprising words in bold",
    ):
        table.add_column(column, overflow="fold")
    for g in groups[:top]:
        streams = g.streams
        last = (g.worst.last_line or g.first) if g.count == 1 else g.last  # one multi-line event: its range
        table.add_row(
            f"{g.worst.score:.2f}", str(g.count), f"{g.first}" if last == g.first else f"{g.first}-{last}",
            Text(printable(streams[0]) + (f" +{len(streams) - 1}" if len(streams) > 1 else "")),
            example_text(g.worst),
        )  # fmt: skip
    console.print(table)
    if len(groups) > top:
        console.print(
            f"... {len(groups) - top} more groups (--json or --report lists them all)", highlight=False
        )
    if report.quiet:
        quiet = Table(
            title=f"sources that stopped logging: {len(report.quiet)} (score = -log10 p of a normal gap this long)"
        )
        for column in ("score", "noticed at line", "stream", "source"):
            quiet.add_column(column, overflow="fold")
        for q in report.quiet[:top]:
            offset = q.record.offset
            quiet.add_row(
                f"{q.score:.2f}",
                str(offset + 1) if offset is not None else "-",
                Text(printable(q.record.stream)),
                Text(printable(q.record.line)),
            )
        console.print(quiet)


EXAMPLE_CHARS = 240  # a longer example shows only the surroundings of its surprising words


def example_text(unit: Unit) -> Text:
    """A unit's line as its template with the surprising words highlighted, and why (dim);
    control characters escaped (`printable`): a log line must not drive the terminal."""
    from logstream.report.groups import why

    explanation = unit.explanation
    if explanation is None:  # a session's worst line below the line threshold, or a stream end
        return Text(printable(unit.text[:EXAMPLE_CHARS], newlines=True))
    text = Text()
    for piece, hit in explanation.compact(EXAMPLE_CHARS):  # ** marks the words where styles do not show
        piece = printable(piece, newlines=True)  # a multi-line event keeps its lines
        text.append(f"**{piece}**" if hit else piece, style="bold red" if hit else "")
    text.append("\n" + printable(why(unit)), style="dim")
    return text


@app.command("replay")
def replay_command(
    input: Annotated[
        Path, typer.Argument(help="Log file (or sessions JSONL) to stream through the detector.")
    ],
    model: Annotated[
        Path | None,
        typer.Option(
            help="Model directory, or a model store (its live version); without it, a model is "
            "trained on the input (see --auto-train)."
        ),
    ] = None,
    format: FormatOpt = Format.lines,
    labels: Annotated[
        Path | None, typer.Option(help="One 0/1 per input line, to evaluate (lines format).")
    ] = None,
    stream_key: StreamKeyOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write every score as JSONL here.")] = None,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Write only one JSON summary line to stdout (the tables go to stderr)."),
    ] = False,
    report_path: Annotated[
        Path | None,
        typer.Option(
            "--report", help="Write a self-contained HTML report here (timeline, groups, patterns)."
        ),
    ] = None,
    auto_train: Annotated[
        AutoTrain,
        typer.Option(
            help="Without --model: 'first' trains on the first half and scores only the rest; 'all' scores "
            "every line, each part by a model trained on the lines before it (the first part by its own)."
        ),
    ] = AutoTrain.first,
    preset: PresetOpt = "auto",
    window: WindowOpt = None,
    seed: SeedOpt = 0,
    max_steps: StepsOpt = 2000,
    merge_across_words: MergeAcrossWordsOpt = False,
    false_alarm_rate: RateOpt = None,
    threshold: ThresholdOpt = None,
    quiet_sources: QuietSourcesOpt = True,
    alerts: Annotated[
        Path | None,
        typer.Option(help="Alert routes file: also print the alerts on-call would have received."),
    ] = None,
    deliver: Annotated[
        bool, typer.Option("--deliver", help="With --alerts: send those alerts (default: dry run).")
    ] = False,
    multiline: MultilineOpt = "auto",
    feedback: FeedbackDbOpt = None,
) -> None:
    """Backtest: stream a file through the detector as if live, then show the anomalies by template.

    stdout carries the table and a short summary (with --json: only the JSON summary)."""
    if deliver and alerts is None:
        raise fail("--deliver needs --alerts FILE")
    check_out_file(out, "--out")
    check_out_file(report_path, "--report")
    directory = check_paths([input, *([labels] if labels is not None else [])], model)
    check_feedback_db(feedback)
    from logstream.alerts.config import load_config as load_alerts_config
    from logstream.consumers.inputs import multiline_option

    routes = load_alerts_config(alerts) if alerts is not None else None  # fail before scoring
    joining = multiline_option(multiline)
    from logstream.replay import (
        ReplayOptions,
        ReplayProgress,
        load_replay_input,
        plan,
        run_replay,
        unit_texts,
    )
    from logstream.report.groups import anomaly_groups, mark_new_words

    options = ReplayOptions(
        input=input, model=directory, format=format.value, labels=labels, stream_key=stream_key, out=out,
        auto_train=auto_train.value,
        train_config=_train_config(
            preset, window, seed, max_steps, false_alarm_rate=false_alarm_rate,
            stream_key=stream_key, merge_across_words=merge_across_words, sessions=format is Format.sessions,
        ),
        false_alarm_rate=false_alarm_rate, threshold=threshold, alerts=routes is not None,
        quiet_sources=quiet_sources, multiline=joining, feedback=feedback,
    )  # fmt: skip
    data = load_replay_input(options)
    described = f"{model} ({data.detector.model_id})" if model is not None and data.detector else ""
    sys.stderr.write(printable(plan(options, data, described)) + "\n")
    with _progress() as progress:
        task: list[TaskID] = []

        def phase(description: str, total: int | None) -> None:
            if task:
                progress.stop_task(task[-1])
            task.append(progress.add_task(description, total=total, info=""))

        def advance(n: int, info: str) -> None:
            progress.update(task[-1], advance=n, info=info)

        report = run_replay(options, data, ReplayProgress(phase, advance))
    patterns = report.patterns
    groups = anomaly_groups(patterns)
    if report.unit == "line":  # a session unit holds only its worst line: no history to compare
        mark_new_words((u for g in groups for u in (g.worst, *g.examples)), unit_texts(data, report.columns))
    human = _console(stderr=json_output)  # with --json, stdout holds only the JSON line
    print_report(report, groups, human)
    sent: list[Alert] = []
    if routes is not None:
        with contextlib.redirect_stdout(sys.stderr if json_output else sys.stdout):
            sent = print_alerts(report, routes, deliver, feedback)
    summary = report.summary() | {"anomaly_groups": len(groups), "groups": [g.to_json() for g in groups]}
    if report_path is not None:
        from logstream.report.html import write_report

        texts = unit_texts(data, report.columns)
        title = f"logstream replay of {input.name}"
        write_report(report, summary, texts, report_path, title=title, alerts=sent)
        err.print(f"report: {report_path}", highlight=False)
    for line in summary_lines(report, summary):  # whole lines: a pipe's 160 columns would wrap them
        print(printable(line), file=sys.stderr if json_output else sys.stdout)
    if json_output:
        sys.stdout.write(json.dumps(summary) + "\n")


def summary_lines(report: ReplayReport, summary: dict[str, Any]) -> list[str]:
    """The replay in a few lines for a person: what was scored with what, what crossed the
    threshold (or the highest score, when nothing did), bad input, joined events, metrics."""
    unit, (first, last) = report.unit, report.scored_lines
    chunks = report.chunks
    if report.trained_on_lines is not None:
        a, b = report.trained_on_lines
        by = (
            f"a model trained on lines {a:,}-{b:,}, which are not scored (--auto-train all scores every line)"
        )
    elif len(chunks) > 1:
        by = f"{len(chunks)} models, each trained on the lines before its part (the first on its own)"
    else:
        by = f"the model {chunks[0].model_id}"
    out = [f"scored {len(report.columns):,} {unit}s (lines {first:,}-{last:,}) with {by}"]
    worst, threshold = report.worst, report.threshold
    if summary["anomalies"]:
        out.append(
            f"{summary['anomalies']:,} {unit}s over the threshold {threshold:.2f} (a normal {unit} scores "
            f"that high once in {_once_in(threshold)}) in {summary['anomaly_groups']} groups: the table above"
        )
    elif worst is not None:
        out.append(
            f"nothing over the threshold {threshold:.2f}: the highest score was {worst[0]:.2f} (line "
            f"{worst[1]:,}), which a normal {unit} reaches about once in {_once_in(worst[0])}"
        )
    if report.bad_input:
        out.append("bad lines skipped: " + ", ".join(f"{k}={n:,}" for k, n in report.bad_input.items()))
    joins = report.joins
    if joins.events:
        cut = f", {joins.cut:,} cut at their size limit" if joins.cut else ""
        out.append(f"multi-line events: {joins.events:,} records joined from {joins.lines:,} lines{cut}")
    if "precision" in summary:
        out.append(
            f"against the labels ({summary['positives']:,} anomalous): precision {summary['precision']:.3f}, "
            f"recall {summary['recall']:.3f}, F1 {summary['f1']:.3f}, AUC-PR {summary['auc_pr']:.3f}"
        )
    return out


def _once_in(score: float) -> str:
    """How rare a score is among normal lines: 10^score, as a count or a power of ten."""
    return f"{10**score:,.0f}" if score < 6 else f"10^{score:.0f}"


def print_alerts(
    report: ReplayReport, routes: AlertsConfig, deliver: bool, feedback: Path | None = None
) -> list[Alert]:
    """Route the replay's anomalies, print one line per notification (a firing one with the
    past incidents of the replay most like it under it) and return the notifications.

    The anomalies are the detector's own (`Detector.anomaly`, as serve and tail hand them
    off), collected as they were scored (`ReplayOptions.alerts`). Grouping runs on the log's
    own time where a line starts with a timestamp (a line without one takes the latest time
    seen before it; a log without any is replayed as if all of it arrived now). In lines
    format each alert carries the stream's lines around it (the whole file is at hand, so
    the lines after it too). Its verdicts are --feedback's."""
    from logstream.alerts.past import seen_before
    from logstream.alerts.pipeline import format_alert, run_replay_alerts

    sent, pending = run_replay_alerts(report.anomalies, routes, deliver=deliver, feedback_path=feedback)
    for alert in sent:
        sys.stdout.write(printable(format_alert(alert, routes)) + "\n")
        for line in seen_before(alert.past_incidents):
            sys.stdout.write("    " + printable(line) + "\n")
    verb = "sent" if deliver else "would send (dry run; --deliver sends)"
    left = f", {pending} still pending in the outbox" if pending else ""
    summary = f"alerts: {len(report.anomalies)} anomalies -> {len(sent)} notifications {verb}{left}"
    err.print(summary, highlight=False, markup=False)
    return sent


app.add_typer(
    alerts_app, name="alerts", help="Check routes files, run delivery; add, list and expire silences."
)
app.add_typer(feedback_app, name="feedback", help="Mark alerts' templates normal or confirmed anomalies.")
app.add_typer(models_app, name="models", help="Versioned models: add, list, show, promote, rollback.")
app.add_typer(incidents_app, name="incidents", help="Past incidents like a new one: search, show, resolve.")


@app.command("serve")
def serve_command(
    config: Annotated[
        Path,
        typer.Option(help="Serve config YAML (see configs/serve.yaml); LOGSTREAM_* env overrides it."),
    ] = Path("configs/serve.yaml"),
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Check the config and exit: the settings, the model (or store) loads, the alert routes "
            "parse (without their secrets); Kafka is not contacted.",
        ),
    ] = False,
    role: Annotated[
        str,
        typer.Option(
            help="scorer: score (and repartition, if repartition.in_process); "
            "repartition: only the repartition stage, no model (docs/serve.md)."
        ),
    ] = "scorer",
) -> None:
    """Serve live from Kafka: score every line, hand anomalies off, commit offsets after hand-off."""
    from logstream.serve import main as serve_main  # imports aiokafka only for this command

    if role not in ("scorer", "repartition"):
        raise typer.BadParameter(f"{role!r}: expected scorer or repartition", param_hint="--role")
    raise typer.Exit(serve_main(config, check=check, role=role))


@app.command("tail")
def tail_command(
    inputs: Annotated[
        list[str],
        typer.Argument(help="Log files to follow (through rotation), or - for stdin (read from its start)."),
    ],
    model: Annotated[
        Path,
        typer.Option(
            help="Model directory (logstream train), or a model store: its live version, and the "
            "next one whenever `logstream models promote` or `rollback` changes it (as serve follows it)."
        ),
    ],
    stream_key: Annotated[
        str | None,
        typer.Option(
            help=r"Regex whose first group (or match) names a line's stream, e.g. 'blk_-?\d+'. "
            "Default: the model's saved stream key, else one 'default' stream."
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print each anomaly as a JSON line (every field).")
    ] = False,
    alerts: Annotated[
        Path | None,
        typer.Option(help="Alert routes file: route anomalies as serve does (durable outbox)."),
    ] = None,
    from_start: Annotated[
        bool,
        typer.Option(
            "--from-start",
            help="Read each file from its start. Without it a file is read from its end, as tail -F "
            "does: only lines written from now on are scored.",
        ),
    ] = False,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Read the files from their start to their end and exit instead of following."
        ),
    ] = False,
    false_alarm_rate: RateOpt = None,
    threshold: ThresholdOpt = None,
    quiet_sources: QuietSourcesOpt = True,
    multiline: MultilineOpt = "auto",
    feedback: FeedbackDbOpt = None,
) -> None:
    """Live without Kafka: follow files or stdin, score each line, print (and route) anomalies.

    A start line on stderr says what is followed from where, with which model and threshold."""
    from logstream.consumers.inputs import STDIN, compile_stream_key, multiline_option

    if inputs.count(STDIN) > 1:
        raise fail("tail: - (stdin) can be given once")
    for name in inputs:
        if name != STDIN:
            check_followed(Path(name))
    compile_stream_key(stream_key)  # InputError naming --stream-key if RE2 cannot run it
    joining = multiline_option(multiline)
    directory = model_dir(model)  # a wrong --model fails before the model code loads
    check_feedback_db(feedback)
    from logstream.alerts.config import AlertConfigError
    from logstream.alerts.outbox import OutboxError
    from logstream.alerts.pipeline import open_alert_sink
    from logstream.detector import Detector
    from logstream.lifecycle.follower import ModelFollower
    from logstream.tail import TailOptions, run_tail, start_line

    sensitivity = {
        "false_alarm_rate": false_alarm_rate,
        "threshold": threshold,
        "rules": feedback_rules(feedback),
    }
    follower = ModelFollower(model, sensitivity) if is_store(model) else None
    detector = follower.load_live() if follower is not None else Detector.load(directory, **sensitivity)
    key = stream_key or detector.meta.get("stream_key")
    compile_stream_key(key)  # the model's own key (checked when it was trained)
    try:
        sink = open_alert_sink(alerts) if alerts is not None else None
    except (AlertConfigError, OutboxError) as exc:
        raise fail(str(exc)) from None
    options = TailOptions(
        inputs=inputs, stream_regex=key, once=once, from_start=from_start or once, json_output=json_output,
        quiet_sources=quiet_sources, multiline=joining,
    )  # fmt: skip
    shown = f"store {model}, live version {follower.version}" if follower is not None else str(model)
    sys.stderr.write(start_line(options, detector, shown) + "\n")
    stats = run_tail(options, detector, sys.stdout, sink, follower=follower)
    sys.stderr.write(stats.summary() + "\n")


def check_feedback_db(path: Path | None) -> None:
    """A feedback database to obey: a file that exists (`logstream feedback` or serve wrote it)."""
    if path is not None and not path.is_file():
        what = "a directory" if path.is_dir() else "no such file"
        raise fail(
            f"--feedback: {path} is {what}; give the alert outbox (or feedback.database) that "
            "`logstream feedback ... --alerts ROUTES` writes verdicts to"
        )


def feedback_rules(path: Path | None) -> FeedbackRules | None:
    """The verdicts in `path`, re-read as they change (None: no --feedback)."""
    if path is None:
        return None
    from logstream.lifecycle.feedback import FeedbackError, FeedbackRules, FeedbackStore

    try:
        return FeedbackRules(FeedbackStore(path))
    except FeedbackError as exc:
        raise fail(str(exc)) from None


def check_followed(path: Path) -> None:
    """A file `tail` can follow: it exists (it may be empty) and is no directory."""
    if path.is_dir():
        raise fail(f"tail: {path} is a directory; give the log files in it ({path}/*.log)")
    if not path.exists():
        raise fail(
            f"tail: {path}: no such file; tail follows a file that exists (check the path, or create it)"
        )
    if not path.is_file():
        raise fail(f"tail: {path} is not a regular file; pipe it in: ... | logstream tail - --model ...")


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option(help="Folder for the sample logs, the model and the scores.")] = Path(
        "runs/demo"
    ),
    preset: PresetOpt = "tiny",
    window: Annotated[int, typer.Option(min=16, help="Rolling window L: ring slots per stream.")] = 128,
    max_steps: StepsOpt = 600,
) -> None:
    """The embedded default backtest: train on a synthetic system's baseline, replay a log with incidents.

    The tiny preset and a 128-token window keep it to a few minutes on a 2-core CPU; the
    synthetic system is simple enough for them. On real logs, `train` picks the preset by the
    baseline's size (auto: tiny below 50,000 lines, small from there) and the window too.
    """
    files = write_demo_logs(out)
    err.print(f"demo: baseline {files.baseline}, incident log {files.incidents} (labels: {files.labels})")
    train_command(
        [files.baseline], out=out / "model", format=Format.lines, only_normal=False, preset=preset,
        window=window, seed=0, max_steps=max_steps,
        stream_key=STREAM_KEY, false_alarm_rate=None,
    )  # fmt: skip
    replay_command(
        files.incidents, model=out / "model", format=Format.lines, labels=files.labels, stream_key=STREAM_KEY,
        out=out / "scores.jsonl", json_output=False, report_path=out / "report.html", auto_train=AutoTrain.first, preset=preset, window=window,
        seed=0, max_steps=max_steps, false_alarm_rate=None,
        threshold=None, alerts=None, deliver=False,
    )  # fmt: skip


def main() -> None:
    """Entry point: an error the user can fix (`UserError`) is one line and exit 2; anything
    else is a bug and keeps its traceback."""
    try:
        app()
    except UserError as exc:
        sys.stderr.write(f"error: {printable(str(exc))}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
