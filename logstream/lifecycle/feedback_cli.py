"""`logstream feedback normal|anomaly|list`: tell the detector what an alert really was.

    logstream feedback normal --alerts configs/alerts.yaml --fingerprint logstream-3f2a... -c "deploy noise"
    logstream feedback normal --alerts configs/alerts.yaml --fingerprint logstream-3f2a... --template 2
    logstream feedback normal --alerts configs/alerts.yaml --template 'GET /health <NUM> ms' --stream 'web-*' --for 7d
    logstream feedback normal --db outbox.db --model runs/model --at /var/log/app.log:1042
    logstream feedback anomaly --alerts configs/alerts.yaml --audit audit.jsonl --at logs/0@1234
    logstream feedback list --alerts configs/alerts.yaml

The verdict is stored in the outbox database (next to the silences; see logstream.lifecycle.feedback)
as by the user running the command, and a running serve obeys it within its
`feedback.refresh_seconds`. Errors are one line, exit status 2; a fingerprint whose alert
group holds several templates lists them (exit 2) for `--template N` or `--all`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from logstream.alerts.cli import _user
from logstream.lifecycle.feedback import (
    EVERY_STREAM,
    Feedback,
    FeedbackError,
    FeedbackStore,
    effective,
    valid,
)
from logstream.lifecycle.feedback_targets import AmbiguousTarget, Stamp, Target, expiry, resolve
from logstream.text.normalize import Normalizer

app = typer.Typer(no_args_is_help=True, help=__doc__, add_completion=False)

AlertsOpt = Annotated[
    Path | None, typer.Option("--alerts", help="Alert routes file: feedback goes to its outbox database.")
]
DbOpt = Annotated[Path | None, typer.Option("--db", help="Or the feedback database file itself.")]
TemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="A template as alerts show it (`template_text`), e.g. 'GET <*> <NUM>'; with --fingerprint,"
        " the number of one of its group's templates."
    ),
]
LineOpt = Annotated[str | None, typer.Option(help="A raw log line (needs --model to mask it).")]
FingerprintOpt = Annotated[
    str | None, typer.Option(help="An alert's fingerprint (dedup_key, `logstream-...`), from the outbox.")
]
AllOpt = Annotated[bool, typer.Option("--all", help="With --fingerprint: every template of its alert group.")]
AtOpt = Annotated[
    str | None,
    typer.Option(
        help="path:line (read from the file; needs --model) or topic/partition@offset (needs --audit)."
    ),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option(
        help="Model directory whose masking turns a raw line into a template (default for an alert"
        " group's lines: the masking `logstream train` writes)."
    ),
]
AuditOpt = Annotated[Path | None, typer.Option(help="serve's audit log, to look up topic/partition@offset.")]
StreamOpt = Annotated[str, typer.Option(help="The streams it applies to, a glob such as 'checkout-*'.")]
ForOpt = Annotated[str | None, typer.Option("--for", help="Expire after this long, e.g. 2h, 7d.")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="Or expire at this time (RFC 3339).")]
CommentOpt = Annotated[str, typer.Option("--comment", "-c", help="Why (kept with the verdict).")]


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


def local_author() -> Stamp:
    """Who runs this command: the OS user (uid when it has no name) on this host."""
    return Stamp(created_by=_user() or f"uid:{os.getuid()}", remote=f"local:{socket.gethostname()}")


def give(
    verdict: str,
    store_path: Path,
    target: Target,
    *,
    normalizer: Normalizer | None = None,
    audit_log: Path | None = None,
    stamp: Stamp | None = None,
) -> list[Feedback]:
    """Resolve and store the verdicts of one target (what both commands and tests call)."""
    store = FeedbackStore(store_path)
    made = resolve(
        verdict, target, store, normalizer=normalizer, audit_log=audit_log, stamp=stamp or local_author()
    )
    return [store.add(feedback) for feedback in made]


def _pick(template: str | None, fingerprint: str | None) -> tuple[str | None, int | None]:
    """--template as text, or with --fingerprint as a template number."""
    if fingerprint is None or template is None:
        return template, None
    if not template.isdigit():
        raise FeedbackError("--template with --fingerprint is the number of one of its group's templates")
    return None, int(template)


def _command(verdict: str) -> None:
    def command(
        alerts: AlertsOpt = None,
        db: DbOpt = None,
        template: TemplateOpt = None,
        line: LineOpt = None,
        fingerprint: FingerprintOpt = None,
        every: AllOpt = False,
        at: AtOpt = None,
        model: ModelOpt = None,
        audit: AuditOpt = None,
        stream: StreamOpt = EVERY_STREAM,
        expires_for: ForOpt = None,
        until: UntilOpt = None,
        comment: CommentOpt = "",
    ) -> None:
        text, pick = _pick(template, fingerprint)
        target = Target(template=text, line=line, fingerprint=fingerprint, at=at, pick=pick, every=every)
        normalizer = model_normalizer(model)
        stamp = replace(local_author(), comment=comment, stream=stream, expires_at=expiry(expires_for, until))
        try:
            made = give(
                verdict, database(alerts, db), target, normalizer=normalizer, audit_log=audit, stamp=stamp
            )
        except AmbiguousTarget as exc:
            listing = "".join(f"  {i}  {t}\n" for i, t in enumerate(exc.templates, 1))
            sys.stderr.write(f"error: {exc}: --template N or --all\n{listing}")
            raise typer.Exit(2) from None
        for feedback in made:
            scope = "" if feedback.stream == EVERY_STREAM else f" (streams {feedback.stream})"
            sys.stdout.write(f"{feedback.id}: {feedback.verdict}: {feedback.template}{scope}\n")

    command.__doc__ = (
        f"Mark a template {verdict}"
        + (
            ": its lines never alert again (scoring obeys it)."
            if verdict == "normal"
            else ": a confirmed incident (it overrides broader normal rules)."
        )
        + " Stored with who/when/why; training data for the next model."
    )
    app.command(verdict)(command)


for _verdict in ("normal", "anomaly"):
    _command(_verdict)


def state(feedback: Feedback, in_force: set[int | None], now: float) -> str:
    """in force | expired | refused (fails the rule check) | superseded (a newer one on its
    template and scope is in force)."""
    if feedback.id in in_force:
        return "in force"
    if not feedback.in_force(now):
        return "expired"
    return "superseded" if valid(feedback) else "refused"


@app.command("list")
def list_command(alerts: AlertsOpt = None, db: DbOpt = None) -> None:
    """Every verdict, oldest first, with its state (in force, expired, superseded, refused):
    id, when, verdict, template, streams, expiry, who, from where, why (JSON lines)."""
    listed = FeedbackStore(database(alerts, db)).listed()
    now = time.time()
    in_force = {f.id for f in effective(listed, now)}
    for feedback in listed:
        sys.stdout.write(json.dumps({**feedback.to_json(), "state": state(feedback, in_force, now)}) + "\n")
