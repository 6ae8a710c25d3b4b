"""`logstream feedback normal|anomaly|list`: tell the detector what an alert really was.

    logstream feedback normal --alerts configs/alerts.yaml --fingerprint logstream-3f2a... -c "deploy noise"
    logstream feedback normal --alerts configs/alerts.yaml --template 'GET /health <NUM> ms'
    logstream feedback normal --db outbox.db --model runs/model --at /var/log/app.log:1042
    logstream feedback anomaly --alerts configs/alerts.yaml --audit audit.jsonl --at logs/0@1234
    logstream feedback list --alerts configs/alerts.yaml

The verdict is stored in the outbox database (next to the silences; see logstream.feedback)
and a running serve obeys a "normal" within its `feedback.refresh_seconds`. Errors are one
line, exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from logstream.alerts.cli import _user
from logstream.feedback import Feedback, FeedbackError, FeedbackStore, Target, resolve
from logstream.normalize import Normalizer

app = typer.Typer(no_args_is_help=True, help=__doc__, add_completion=False)

AlertsOpt = Annotated[
    Path | None, typer.Option("--alerts", help="Alert routes file: feedback goes to its outbox database.")
]
DbOpt = Annotated[Path | None, typer.Option("--db", help="Or the feedback database file itself.")]
TemplateOpt = Annotated[
    str | None, typer.Option(help="A template as alerts show it (`template_text`), e.g. 'GET <*> <NUM>'.")
]
LineOpt = Annotated[str | None, typer.Option(help="A raw log line (needs --model to mask it).")]
FingerprintOpt = Annotated[
    str | None, typer.Option(help="An alert's fingerprint (dedup_key, `logstream-...`), from the outbox.")
]
AtOpt = Annotated[
    str | None,
    typer.Option(
        help="path:line (read from the file; needs --model) or topic/partition@offset (needs --audit)."
    ),
]
ModelOpt = Annotated[
    Path | None, typer.Option(help="Model directory whose masking turns a raw line into a template.")
]
AuditOpt = Annotated[Path | None, typer.Option(help="serve's audit log, to look up topic/partition@offset.")]
CommentOpt = Annotated[str, typer.Option("--comment", "-c", help="Why (kept with the verdict).")]
ByOpt = Annotated[str, typer.Option(help="Who (default: the current user).")]


def database(alerts: Path | None, db: Path | None) -> Path:
    """The feedback database: the routes file's outbox, or the file given."""
    if (alerts is None) == (db is None):
        raise FeedbackError("give exactly one of --alerts ROUTES and --db FILE")
    if db is not None:
        return db
    from logstream.alerts.config import load_config

    return Path(load_config(alerts, secrets=False).delivery.outbox)


def model_normalizer(model: Path | None) -> Normalizer | None:
    """The masking rules saved with a model (logstream.json only; the weights stay unread)."""
    if model is None:
        return None
    try:
        meta = json.loads((model / "logstream.json").read_text(encoding="utf-8"))
        return Normalizer.from_json(meta["mask_rules"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FeedbackError(f"--model {model}: cannot read its masking rules: {exc}") from None


def give(
    verdict: str,
    store_path: Path,
    target: Target,
    *,
    normalizer: Normalizer | None = None,
    audit_log: Path | None = None,
    created_by: str = "",
    comment: str = "",
) -> Feedback:
    """Resolve and store one verdict (what both commands and tests call)."""
    store = FeedbackStore(store_path)
    try:
        feedback = resolve(
            verdict, target, store, normalizer=normalizer, audit_log=audit_log, created_by=created_by,
            comment=comment,
        )  # fmt: skip
        return store.add(feedback)
    finally:
        store.close()


def _command(verdict: str) -> None:
    def command(
        alerts: AlertsOpt = None,
        db: DbOpt = None,
        template: TemplateOpt = None,
        line: LineOpt = None,
        fingerprint: FingerprintOpt = None,
        at: AtOpt = None,
        model: ModelOpt = None,
        audit: AuditOpt = None,
        comment: CommentOpt = "",
        by: ByOpt = "",
    ) -> None:
        target = Target(template=template, line=line, fingerprint=fingerprint, at=at)
        made = give(
            verdict, database(alerts, db), target, normalizer=model_normalizer(model), audit_log=audit,
            created_by=by or _user(), comment=comment,
        )  # fmt: skip
        sys.stdout.write(f"{made.id}: {made.verdict}: {made.template}\n")

    command.__doc__ = (
        f"Mark a template {verdict}"
        + (
            ": its lines never alert again (scoring obeys it)."
            if verdict == "normal"
            else ": a confirmed incident."
        )
        + " Stored with who/when/why; training data for the next model."
    )
    app.command(verdict)(command)


for _verdict in ("normal", "anomaly"):
    _command(_verdict)


@app.command("list")
def list_command(alerts: AlertsOpt = None, db: DbOpt = None) -> None:
    """Every verdict, oldest first: id, when, verdict, template, who, why (JSON lines)."""
    store = FeedbackStore(database(alerts, db))
    try:
        for feedback in store.listed():
            sys.stdout.write(json.dumps(feedback.to_json()) + "\n")
    finally:
        store.close()
