"""`logstream models ...`: the versioned model store (see logstream.lifecycle.model_store).

    logstream models add --store models/ runs/candidate -c "after the 2.4 deploy"
    logstream models list --store models/
    logstream models show --store models/ v0002
    logstream models promote --store models/ v0002 -c "shadow clean for a day"
    logstream models rollback --store models/ -c "pages on the checkout stream"

`add` and `promote` first load the version on the CPU and score a trial line with it
(`live_model.load_checked`; `promote` also checks its files against the content hash the
store recorded), and refuse one that does not load: a serve that follows the store never
gets a version it cannot load from them. A serve with `model.store` set follows the live
version (hot reload, no restart). Errors are one line, exit status 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from logstream.alerts.cli import _user
from logstream.errors import UserError
from logstream.lifecycle import model_store

if TYPE_CHECKING:
    from logstream.lifecycle.shadow import Gate

app = typer.Typer(no_args_is_help=True, help=__doc__, add_completion=False)

FeedbackOpt = Annotated[
    Path | None, typer.Option(help="Feedback database: the candidate must flag every confirmed anomaly.")
]
RatioOpt = Annotated[
    float, typer.Option(min=0.0, help="Gate: candidate's alert rate at most this times the live one's.")
]
StoreOpt = Annotated[
    Path, typer.Option("--store", help="The model store directory (local path or mounted volume).")
]
CommentOpt = Annotated[str, typer.Option("--comment", "-c", help="Why (kept in the store's history).")]
ByOpt = Annotated[str, typer.Option(help="Who (default: the current user).")]


def _trial(directory: Path, refused: str) -> None:
    """Load the model and score a trial line; a StoreError saying what was `refused` if it fails."""
    from logstream.lifecycle.follower import load_checked  # torch: only for the commands that load

    try:
        load_checked(directory, {"device": "cpu"})
    except UserError as exc:
        raise model_store.StoreError(f"{refused}: {exc}") from None


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def evaluate(model_dir: Path, log: Path, labels: Path | None) -> dict[str, object]:
    """Score a fixed replay file with the model (streams by its saved stream key): lines,
    flagged per 10k, and with labels precision and recall; the file's hash names the set."""
    import hashlib

    from logstream.consumers.inputs import InputStats, line_parser, read_labels, read_records
    from logstream.detector import Detector

    detector = Detector.load(model_dir, device="cpu")
    # as replay reads it: serve's parser and bad-input policy, the model's saved stream key
    records = list(read_records(log, InputStats(), line_parser(detector.meta.get("stream_key"))))
    flagged = [s.is_anomaly for s in detector.score(records)]
    lines = records
    result: dict[str, object] = {
        "replay_set": str(log), "replay_sha256": hashlib.sha256(log.read_bytes()).hexdigest(),
        "lines": len(lines), "flagged": sum(flagged),
        "flagged_per_10k": round(1e4 * sum(flagged) / max(1, len(lines)), 1),
        "false_alarm_rate": detector.false_alarm_rate or detector.calibration.config.false_alarm_rate,
    }  # fmt: skip
    if labels is not None:
        truth = read_labels(labels, len(lines))
        hits = sum(f and t for f, t in zip(flagged, truth, strict=True))
        result["precision"] = round(hits / max(1, sum(flagged)), 3)
        result["recall"] = round(hits / max(1, sum(truth)), 3)
    return result


@app.command("add")
def add_command(
    model_dir: Annotated[Path, typer.Argument(help="A model directory `logstream train` wrote.")],
    store: StoreOpt,
    replay_set: Annotated[
        Path | None,
        typer.Option("--evaluate", help="A fixed replay file to score; the result goes in lineage.json."),
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="With --evaluate: one 0/1 per line (precision, recall).")
    ] = None,
    comment: CommentOpt = "",
    by: ByOpt = "",
) -> None:
    """Copy a trained model into the store as the next immutable version (not live yet),
    once it loaded and scored a trial line."""
    if labels is not None and replay_set is None:
        raise model_store.StoreError("--labels needs --evaluate FILE")
    _trial(model_dir, "not added")
    evaluation = evaluate(model_dir, replay_set, labels) if replay_set is not None else None
    name = model_store.add(store, model_dir, evaluation=evaluation, by=by or _user(), comment=comment)
    sys.stdout.write(f"{name}\n")


@app.command("list")
def list_command(store: StoreOpt) -> None:
    """Every version, oldest first: name, live marker, parent, training lines, data hash, added."""
    live = model_store.live(store)
    for name in model_store.versions(store):
        info = model_store.lineage(store, name)
        sys.stdout.write(
            f"{'*' if name == live else ' '} {name}  parent={info.get('parent') or '-'}  "
            f"lines={info.get('train_lines', '?')}  data={str(info.get('data_sha256', ''))[:12]}  "
            f"added={_when(info.get('added_at', 0))}  {info.get('comment', '')}\n"
        )


@app.command("show")
def show_command(
    store: StoreOpt,
    version: Annotated[str | None, typer.Argument(help="A version (default: the live one).")] = None,
) -> None:
    """A version's lineage (JSON): parent, data hash, window and counts, training config,
    calibration, feedback learned, evaluation; and its promotions."""
    name = version or model_store.live(store)
    if name is None:
        raise model_store.StoreError(f"model store {store}: nothing promoted yet; name a version")
    info = model_store.lineage(store, name)
    info["promotions"] = [vars(e) for e in model_store.history(store) if e.version == name]
    sys.stdout.write(json.dumps(info, indent=2) + "\n")


@app.command("promote")
def promote_command(
    store: StoreOpt,
    version: Annotated[str, typer.Argument(help="The version to make live.")],
    gate_audit: Annotated[
        Path | None,
        typer.Option(help="Promote only if this version passes the gate as the shadow in serve's audit log."),
    ] = None,
    feedback: FeedbackOpt = None,
    max_rate_ratio: RatioOpt = 1.5,
    comment: CommentOpt = "",
    by: ByOpt = "",
) -> None:
    """Make a version live, once it loaded and scored a trial line; serve processes following
    the store switch to it."""
    if gate_audit is not None:
        _, shadow, verdict = _compare(gate_audit, None, None, feedback, max_rate_ratio)
        if shadow is None or verdict is None or not shadow.startswith(f"{version}@"):
            raise model_store.StoreError(
                f"--gate-audit: {gate_audit} has no shadow run of {version} next to one live model"
            )
        if not verdict.passed:
            sys.stderr.write(f"{version}: gate FAILED, not promoted\n")
            raise typer.Exit(1)
    _trial(model_store.version_dir(store, version), f"{version} not promoted")
    entry = model_store.promote(store, version, by=by or _user(), comment=comment)
    sys.stdout.write(f"live: {entry.version} (was {entry.previous or 'none'})\n")


@app.command("rollback")
def rollback_command(store: StoreOpt, comment: CommentOpt = "", by: ByOpt = "") -> None:
    """Go back to the version live before the current one (one command; serve follows)."""
    entry = model_store.rollback(store, by=by or _user(), comment=comment)
    sys.stdout.write(f"live: {entry.version} (rolled back)\n")


def _time(text: str | None, option: str) -> float | None:
    """An RFC 3339 time (`2026-12-01T09:00:00Z`) or unix seconds."""
    if text is None:
        return None
    from datetime import datetime

    try:
        return float(text) if text.replace(".", "", 1).isdigit() else datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise model_store.StoreError(f"{option}: {text!r} is not a time (RFC 3339 or unix seconds)") from None


@app.command("compare")
def compare_command(
    audit: Annotated[Path, typer.Option(help="serve's audit log (it holds the live and the shadow scores).")],
    since: Annotated[str | None, typer.Option(help="From this time (RFC 3339 or unix s).")] = None,
    until: Annotated[str | None, typer.Option(help="Up to this time (exclusive).")] = None,
    feedback: FeedbackOpt = None,
    max_rate_ratio: RatioOpt = 1.5,
) -> None:
    """Live vs shadow model from the audit log: lines, flagged per 10k, overlap, and the
    promotion gate (exit 1 when the candidate fails it)."""
    _, _, verdict = _compare(
        audit, _time(since, "--since"), _time(until, "--until"), feedback, max_rate_ratio
    )
    if verdict is not None and not verdict.passed:
        raise typer.Exit(1)


def _compare(
    audit: Path, since: float | None, until: float | None, feedback: Path | None, max_rate_ratio: float
) -> tuple[str | None, str | None, Gate | None]:
    """Print the live and shadow tallies and the gate; (live id, shadow id, gate), Nones
    when the range does not hold exactly one live and one shadow model."""
    from logstream.lifecycle.feedback import FeedbackStore, latest_verdicts
    from logstream.lifecycle.shadow import gate, tally

    tallies = tally(audit, since, until)
    for model, t in sorted(tallies.items()):
        role = "shadow" if t.shadow else "live"
        sys.stdout.write(
            f"{role:<6}  {model}  lines={t.lines}  flagged={t.flagged}  per_10k={t.per_10k:.1f}\n"
        )
    live = [(m, t) for m, t in tallies.items() if not t.shadow]
    shadow = [(m, t) for m, t in tallies.items() if t.shadow]
    if len(live) != 1 or len(shadow) != 1:
        sys.stderr.write("no gate: needs exactly one live and one shadow model in the range\n")
        return None, None, None
    confirmed: list[str] = []
    if feedback is not None:
        store = FeedbackStore(feedback)
        try:
            confirmed = [t for t, v in latest_verdicts(store.listed()).items() if v == "anomaly"]
        finally:
            store.close()
    (live_id, live_tally), (shadow_id, shadow_tally) = live[0], shadow[0]
    overlap = len(live_tally.flagged_at & shadow_tally.flagged_at)
    verdict = gate(live_tally, shadow_tally, confirmed, max_rate_ratio)
    sys.stdout.write(
        f"overlap={overlap} lines flagged by both; rate ratio {verdict.rate_ratio:.2f} (gate {max_rate_ratio}); "
        f"confirmed anomalies missed: {len(verdict.missed)}; gate {'passed' if verdict.passed else 'FAILED'}\n"
    )
    return live_id, shadow_id, verdict
