"""`logstream alerts ...`: check a routes file, run the delivery worker, add, list or expire silences.

    logstream alerts check configs/alerts.yaml                  # no secrets needed
    logstream alerts deliver --alerts configs/alerts.yaml [--until-idle]
    logstream alerts silence add --alerts configs/alerts.yaml -m 'stream=~"prod-db.*"' --for 2h -c "failover"
    logstream alerts silence list --alerts configs/alerts.yaml [--expired]
    logstream alerts silence expire --alerts configs/alerts.yaml 3f2a9c0d1b7e

Silences live in the routes file's outbox database (see logstream.alerts.silences), so
run these where the outbox is (in a pod: `kubectl exec`). Loading the routes file here
never resolves its secrets: nothing is sent. Errors are one line, exit status 2.

The routes, outbox and silences modules (pydantic, sqlite) load inside the commands, so
that `logstream --help`, which registers this app, stays fast.
"""

from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

if TYPE_CHECKING:
    from logstream.alerts.config import AlertsConfig, Silence
    from logstream.alerts.outbox import Outbox

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, help=__doc__, add_completion=False)
silence_app = typer.Typer(no_args_is_help=True, help="Mute alerts for a while (stored in the outbox).")
app.add_typer(silence_app, name="silence")


@app.callback()
def _logs_to_stderr() -> None:
    """Log lines (e.g. a silences file imported) go to stderr: stdout is the command's output."""
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


RoutesOpt = Annotated[
    Path, typer.Option("--alerts", help="Alert routes file (its delivery.outbox holds the silences).")
]


def _one_line_errors(work: Callable[[], T]) -> T:
    """Run `work`; a config or outbox problem is `error: ...` on stderr and exit 2."""
    from logstream.errors import UserError

    try:
        return work()
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(2) from None


@contextmanager
def _outbox(routes: Path) -> Iterator[tuple[AlertsConfig, Outbox]]:
    from logstream.alerts.config import load_config
    from logstream.alerts.outbox import Outbox

    config = load_config(routes, secrets=False)
    outbox = Outbox(config.delivery.outbox, config)
    try:
        yield config, outbox
    finally:
        outbox.close()


def add_silence(
    routes: Path | str, matchers: Sequence[str], duration: float, *, comment: str = "", by: str = ""
) -> Silence:
    """Store a silence starting now in the routes file's outbox; returns it (with its id)."""
    from logstream.alerts.silences import make_silence, parse_matcher_args

    parse_matcher_args(matchers)
    with _outbox(Path(routes)) as (config, outbox):
        now = time.time()
        silence = make_silence(
            config, matchers, starts_at=now, expires_at=now + duration, created_by=by, comment=comment
        )
        outbox.add_silence(silence)
        return silence


def list_silences(routes: Path | str, *, expired: bool = False) -> tuple[AlertsConfig, list[Silence]]:
    """The routes file's config and its outbox's silences (in effect, pending, and with
    `expired` the ended ones)."""
    with _outbox(Path(routes)) as (config, outbox):
        return config, outbox.silences(expired=expired)


def expire_silence(routes: Path | str, silence_id: str) -> bool:
    with _outbox(Path(routes)) as (_, outbox):
        return outbox.expire_silence(silence_id)


def describe_silence(silence: Silence, now: float) -> str:
    """One line: id, state, window, matchers, who and why."""
    from logstream.alerts.config import rfc3339

    state = "expired" if silence.expires_at <= now else "pending" if silence.starts_at > now else "active"
    matchers = ", ".join(str(m) for m in silence.matchers)
    who = f" by {silence.created_by}" if silence.created_by else ""
    why = f": {silence.comment}" if silence.comment else ""
    window = f"{rfc3339(silence.starts_at)} .. {rfc3339(silence.expires_at)}"
    return f"{silence.id or '(routes file)'}  {state:<7}  {window}  {{{matchers}}}{who}{why}"


@app.command("check")
def check_command(
    routes: Annotated[Path, typer.Argument(help="Alert routes file.")],
    resolve_secrets: Annotated[
        bool, typer.Option("--resolve-secrets", help="Also resolve ${ENV} and file: secrets (as serve does).")
    ] = False,
) -> None:
    """Validate a routes file and list every problem; secrets are only checked for form."""
    from logstream.alerts.config import load_config

    config = _one_line_errors(lambda: load_config(routes, secrets=resolve_secrets))
    sys.stdout.write(f"{routes}: ok, {len(config.receivers)} receiver(s)\n")


@app.command("deliver")
def deliver_command(
    routes: RoutesOpt,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit when nothing is pending.")] = False,
) -> None:
    """Run the delivery worker on the routes file's outbox until SIGTERM/SIGINT (or idle)."""
    import signal
    import threading

    from logstream.alerts.config import load_config
    from logstream.alerts.delivery import DeliveryWorker
    from logstream.alerts.outbox import Outbox

    config = _one_line_errors(lambda: load_config(routes))
    outbox = _one_line_errors(lambda: Outbox(config.delivery.outbox, config))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        DeliveryWorker(outbox).run(stop, until_idle=until_idle)
    finally:
        outbox.close()


@silence_app.command("add")
def silence_add_command(
    routes: RoutesOpt,
    match: Annotated[
        list[str],
        typer.Option(
            "--match",
            "-m",
            help='Matcher: label="value", !=, =~ or !~ (e.g. stream=~"prod-db.*"); repeatable.',
        ),
    ],
    duration: Annotated[str, typer.Option("--for", help="How long, e.g. 30m, 2h.")],
    comment: Annotated[str, typer.Option("--comment", "-c", help="Why (shown in logs and lists).")] = "",
    by: Annotated[str, typer.Option(help="Who (default: the current user).")] = "",
) -> None:
    """Mute alerts whose labels match every matcher, from now for a while."""
    from logstream.alerts.config import AlertConfigError, parse_duration, rfc3339

    def add() -> Silence:
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise AlertConfigError(f"--for: {exc}") from None
        return add_silence(routes, match, seconds, comment=comment, by=by or _user())

    made = _one_line_errors(add)
    sys.stdout.write(
        f"{made.id}: silenced {{{', '.join(map(str, made.matchers))}}} until {rfc3339(made.expires_at)}\n"
    )


@silence_app.command("list")
def silence_list_command(
    routes: RoutesOpt,
    expired: Annotated[bool, typer.Option("--expired", help="Also list silences that have ended.")] = False,
) -> None:
    """Silences in the outbox (active and pending; ended ones with --expired), and those in the routes file."""
    config, stored = _one_line_errors(lambda: list_silences(routes, expired=expired))
    now = time.time()
    shown = [*config.silences, *stored]
    for silence in shown:
        if expired or silence.expires_at > now:
            sys.stdout.write(describe_silence(silence, now) + "\n")
    sys.stderr.write(f"{len(stored)} stored silence(s), {len(config.silences)} in the routes file\n")


@silence_app.command("expire")
def silence_expire_command(
    routes: RoutesOpt,
    silence_id: Annotated[str, typer.Argument(help="The id `silence add` printed (see `silence list`).")],
) -> None:
    """End a stored silence now."""
    if not _one_line_errors(lambda: expire_silence(routes, silence_id)):
        sys.stderr.write(
            f"error: no silence {silence_id!r} in effect (see `logstream alerts silence list`)\n"
        )
        raise typer.Exit(2)
    sys.stdout.write(f"{silence_id}: expired\n")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return ""
