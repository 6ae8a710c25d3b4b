"""The `logstream` command line: train, replay (and serve, bench).

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
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from logstream import __version__
from logstream.alerts.cli import app as alerts_app
from logstream.demo import write_demo_logs
from logstream.errors import UserError
from logstream.feedback_cli import app as feedback_app
from logstream.memory.cli import app as incidents_app
from logstream.models_cli import app as models_app
from logstream.scoring.config import DEFAULT_FALSE_ALARM_RATE
from logstream.scoring.evidence import LINE_TOP_K, SESSION_TOP_K
from logstream.synth import STREAM_KEY

if TYPE_CHECKING:
    from logstream.alerts.config import AlertsConfig
    from logstream.groups import Group
    from logstream.replay import ChunkModel, ReplayReport, Unit
    from logstream.train import TrainConfig

# Hugging Face and tqdm progress bars ("Loading weights", "Writing model shards") would mix
# with ours on stderr; set before transformers is first imported.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

PRESET_NAMES = ("tiny", "small", "base")  # logstream.model.PRESETS (imports torch; a test keeps them equal)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
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
    sys.stderr.write(f"error: {message}\n")
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
        min=1, help="Upper bound on optimizer steps; training stops earlier once the validation loss stops improving."
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
    from logstream.scoring.config import ScoringConfig
    from logstream.train import TrainConfig

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


def check_paths(inputs: list[Path], model: Path | None) -> None:
    """Fail on a missing or unusable input file or model directory in a fraction of a second:
    before the command imports torch and transformers, which take seconds."""
    from logstream.inputs import check_file
    from logstream.metadata import read_model_meta

    for path in inputs:
        check_file(path)
    if model is not None:
        read_model_meta(model)


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
    max_steps: StepsOpt = 5000,
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
            help="Continue this model on the inputs (plus its kept sample of old data, and --feedback).",
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
) -> None:
    """Train a detector on baseline logs and write a model directory (HF checkpoint + logstream.json)."""
    check_paths(inputs, from_model)
    from logstream.inputs import (
        InputStats,
        line_parser,
        read_records,
        read_sessions,
        streams_from_records,
        streams_from_sessions,
    )
    from logstream.retrain import continue_training, read_sample, refresh_prompt, write_sample
    from logstream.train import save, train

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
    stats = InputStats()
    streams = []
    for path in inputs:
        if format is Format.sessions:
            sessions = read_sessions(path, stats)
            streams += streams_from_sessions([s for s in sessions if not only_normal or s.label == 0])
        else:
            streams += streams_from_records(read_records(path, stats, line_parser(stream_key)))
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
            f"feedback, {meta['replayed_lines']} replayed lines, window {meta['data_window']}"
            if meta.get("parent")
            else ""
        )
    )


def beyond_chance_note(chunk: ChunkModel) -> str:
    """What a chunk with more alerts than its false-alarm rate explains may be, and how to tell."""
    expected = chunk.items * 10**-chunk.threshold
    return (
        f"note: items {chunk.first + 1}-{chunk.first + chunk.items}: {chunk.anomalies:,} of {chunk.items:,} "
        f"over the threshold, which expects {expected:.1f} of normal ones: an incident that large, or lines "
        "its model never learned (a period it never saw). The groups below say which; a replay with a "
        "baseline of the same period (--model) tells them apart."
    )


def print_report(report: ReplayReport, groups: list[Group], console: Console, top: int = 10) -> None:
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
        table.add_row(
            f"{g.worst.score:.2f}", str(g.count), f"{g.first}" if g.count == 1 else f"{g.first}-{g.last}",
            streams[0] + (f" +{len(streams) - 1}" if len(streams) > 1 else ""), example_text(g.worst),
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
                q.record.stream,
                q.record.line,
            )
        console.print(quiet)


EXAMPLE_CHARS = 240  # a longer example shows only the surroundings of its surprising words


def example_text(unit: Unit) -> Text:
    """A unit's line as its template with the surprising words highlighted, and why (dim)."""
    from logstream.groups import why

    explanation = unit.explanation
    if explanation is None:  # a session's worst line below the line threshold, or a stream end
        return Text(unit.text[:EXAMPLE_CHARS])
    text = Text()
    for piece, hit in explanation.compact(EXAMPLE_CHARS):  # ** marks the words where styles do not show
        text.append(f"**{piece}**" if hit else piece, style="bold red" if hit else "")
    text.append("\n" + why(unit), style="dim")
    return text


@app.command("replay")
def replay_command(
    input: Annotated[
        Path, typer.Argument(help="Log file (or sessions JSONL) to stream through the detector.")
    ],
    model: Annotated[
        Path | None,
        typer.Option(help="Model directory; without it, train on the input (see --auto-train)."),
    ] = None,
    format: FormatOpt = Format.lines,
    labels: Annotated[
        Path | None, typer.Option(help="One 0/1 per input line, to evaluate (lines format).")
    ] = None,
    stream_key: StreamKeyOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write every score as JSONL here.")] = None,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Write only one JSON summary line to stdout (tables go to stderr)."),
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
            help="Without --model: 'first' trains on the first half and scores the rest; 'all' scores every line "
            "prequentially (the first chunk by its own model)."
        ),
    ] = AutoTrain.first,
    preset: PresetOpt = "auto",
    window: WindowOpt = None,
    seed: SeedOpt = 0,
    max_steps: StepsOpt = 5000,
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
) -> None:
    """Backtest: stream a file through the detector as if live, then show the anomalies by template."""
    if deliver and alerts is None:
        raise fail("--deliver needs --alerts FILE")
    check_out_file(out, "--out")
    check_out_file(report_path, "--report")
    check_paths([input, *([labels] if labels is not None else [])], model)
    from logstream.alerts.config import load_config as load_alerts_config

    routes = load_alerts_config(alerts) if alerts is not None else None  # fail before scoring
    from logstream.groups import anomaly_groups, mark_new_words
    from logstream.replay import ReplayOptions, ReplayProgress, load_replay_input, run_replay, unit_texts

    options = ReplayOptions(
        input=input, model=model, format=format.value, labels=labels, stream_key=stream_key, out=out,
        auto_train=auto_train.value,
        train_config=_train_config(
            preset, window, seed, max_steps, false_alarm_rate=false_alarm_rate,
            stream_key=stream_key, merge_across_words=merge_across_words, sessions=format is Format.sessions,
        ),
        false_alarm_rate=false_alarm_rate, threshold=threshold, alerts=routes is not None,
        quiet_sources=quiet_sources,
    )  # fmt: skip
    data = load_replay_input(options)
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
    if routes is not None:
        with contextlib.redirect_stdout(sys.stderr if json_output else sys.stdout):
            print_alerts(report, routes, deliver)
    summary = report.summary() | {"anomaly_groups": len(groups), "groups": [g.to_json() for g in groups]}
    if report_path is not None:
        from logstream.report import write_report

        texts = unit_texts(data, report.columns)
        write_report(report, summary, texts, report_path, title=f"logstream replay of {input.name}")
        err.print(f"report: {report_path}", highlight=False)
    if json_output:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        human.print_json(json.dumps({k: v for k, v in summary.items() if k != "groups"}))


def print_alerts(report: ReplayReport, routes: AlertsConfig, deliver: bool) -> None:
    """Route the replay's anomalies and print one line per notification.

    The anomalies are the detector's own (`Detector.anomaly`, as serve and tail hand them
    off), collected as they were scored (`ReplayOptions.alerts`). Grouping runs on the log's
    own time where a line starts with a timestamp (a line without one takes the latest time
    seen before it; a log without any is replayed as if all of it arrived now). In lines
    format each alert carries the stream's lines around it (the whole file is at hand, so
    the lines after it too)."""
    from logstream.alerts.pipeline import format_alert, run_replay_alerts

    sent, pending = run_replay_alerts(report.anomalies, routes, deliver=deliver)
    for alert in sent:
        sys.stdout.write(format_alert(alert, routes) + "\n")
    verb = "sent" if deliver else "would send (dry run; --deliver sends)"
    left = f", {pending} still pending in the outbox" if pending else ""
    summary = f"alerts: {len(report.anomalies)} anomalies -> {len(sent)} notifications {verb}{left}"
    err.print(summary, highlight=False, markup=False)


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
        bool, typer.Option("--check", help="Only validate the config (settings) and exit.")
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
        list[str], typer.Argument(help="Log files to follow (through rotation), or - for stdin.")
    ],
    model: Annotated[Path, typer.Option(help="Model directory (logstream train).")],
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
    once: Annotated[
        bool, typer.Option("--once", help="Read the files to their end and exit instead of following.")
    ] = False,
    false_alarm_rate: RateOpt = None,
    threshold: ThresholdOpt = None,
    quiet_sources: QuietSourcesOpt = True,
) -> None:
    """Live without Kafka: follow files or stdin, score each line, print (and route) anomalies."""
    from logstream.inputs import STDIN, compile_stream_key
    from logstream.metadata import read_model_meta

    if inputs.count(STDIN) > 1:
        raise fail("tail: - (stdin) can be given once")
    for name in inputs:
        if name != STDIN and not Path(name).is_file():
            raise fail(f"tail: {name} is not a file")
    compile_stream_key(stream_key)  # InputError naming --stream-key if RE2 cannot run it
    read_model_meta(model)  # a wrong --model fails before the model code loads
    from logstream.alerts.config import AlertConfigError
    from logstream.alerts.outbox import OutboxError
    from logstream.alerts.pipeline import open_alert_sink
    from logstream.detector import Detector
    from logstream.live import TailOptions, run_tail

    detector = Detector.load(model, false_alarm_rate=false_alarm_rate, threshold=threshold)
    key = stream_key or detector.meta.get("stream_key")
    compile_stream_key(key)  # the model's own key (checked when it was trained)
    try:
        sink = open_alert_sink(alerts) if alerts is not None else None
    except (AlertConfigError, OutboxError) as exc:
        raise fail(str(exc)) from None
    options = TailOptions(
        inputs=inputs, stream_regex=key, once=once, json_output=json_output, quiet_sources=quiet_sources
    )
    stats = run_tail(options, detector, sys.stdout, sink)
    err.print(stats.summary(), highlight=False, markup=False)


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option(help="Folder for the sample logs, the model and the scores.")] = Path(
        "runs/demo"
    ),
    preset: PresetOpt = "tiny",
    window: WindowOpt = 128,
    max_steps: StepsOpt = 600,
) -> None:
    """The embedded default backtest: train on a synthetic system's baseline, replay a log with incidents.

    The tiny preset and a 128-token window keep it to a few minutes on a 2-core CPU; the
    synthetic system is simple enough for them. Real logs want `train --preset small` (the default).
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


@app.command("bench")
def bench_command(
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes (CI smoke run, < 2 minutes).")] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON (last line).")
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Run only this section (repeatable): table, constant, streams, ablation, peers."),
    ] = None,
    stream_lines: Annotated[
        int | None, typer.Option(min=100, help="Length of the constant-cost stream (full run: 200000).")
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads (default 1).")] = None,
    runs: Annotated[Path, typer.Option(help="Cache of the models the benchmark trains.")] = Path(
        "runs/bench"
    ),
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
) -> None:
    """The benchmarks of docs/benchmarks.md: StreamingLLM table, constant cost, many streams, sinks, peers."""
    import importlib

    # The suite (peer detectors, plots) is no part of the package: it is benchmarks/suite.py of
    # a source checkout, beside this package's folder; its scripts import each other by name.
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    if not (folder / "suite.py").is_file():
        raise fail(f"bench: runs benchmarks/suite.py of a source checkout; there is none at {folder}")
    sys.path.insert(0, str(folder))
    suite = importlib.import_module("suite")
    unknown = sorted(set(only or ()) - set(suite.SECTIONS))
    if unknown:
        raise fail(f"--only: unknown section {unknown[0]!r}; expected one of {', '.join(suite.SECTIONS)}")
    config = suite.with_overrides(
        suite.QUICK if quick else suite.FULL, stream_lines=stream_lines, threads=threads
    )
    sections = tuple(s for s in suite.SECTIONS if not only or s in only)
    run = suite.BenchRun(config=config, sections=sections, runs=runs, plots=plots)
    results = suite.run_bench(run, progress=lambda name: err.print(f"bench: {name}", highlight=False))
    (err if json_output else Console(width=250)).print(suite.render(results), highlight=False, markup=False)
    if json_output:
        sys.stdout.write(json.dumps(results) + "\n")


def main() -> None:
    """Entry point: an error the user can fix (`UserError`) is one line and exit 2; anything
    else is a bug and keeps its traceback."""
    try:
        app()
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
