"""`logstream incidents search|show|resolve`: past incidents, and what was done about them.

    logstream incidents search "No space left on device" --alerts configs/alerts.yaml
    logstream incidents search "$(sed -n 1042p app.log)" --outbox var/alerts-outbox.sqlite --model runs/model
    logstream incidents show logstream-3f2a... --alerts configs/alerts.yaml
    logstream incidents resolve logstream-3f2a... -m "backup job moved off /var" --alerts configs/alerts.yaml

The memory lives in the routes file's outbox database (see logstream.memory.store); run
these where the outbox is. A search compares template words; with `--model` (the model
that raised the alerts) it also compares that model's embedding of the text. Verdicts
come from `logstream feedback`. Errors are one line, exit status 2.

The memory's modules (sqlite, pydantic, and torch for --model) load inside the commands,
so that `logstream --help`, which registers this app, stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from logstream.lifecycle.feedback import Feedback
    from logstream.memory.retrieval import IncidentMemory, PastIncident
    from logstream.memory.store import Incident

app = typer.Typer(no_args_is_help=True, help=__doc__, add_completion=False)

AlertsOpt = Annotated[
    Path | None, typer.Option("--alerts", help="Alert routes file: the memory is in its outbox database.")
]
OutboxOpt = Annotated[Path | None, typer.Option("--outbox", help="Or the outbox database file itself.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON object per line.")]


def database(alerts: Path | None, outbox: Path | None) -> Path:
    """The memory's file: the routes file's outbox, or the file given; it must exist."""
    from logstream.memory.store import IncidentError

    if (alerts is None) == (outbox is None):
        raise IncidentError("give exactly one of --alerts ROUTES and --outbox FILE")
    if outbox is None:
        from logstream.alerts.config import load_config

        outbox = Path(load_config(alerts, secrets=False).delivery.outbox)
    if not outbox.is_file():
        raise IncidentError(f"incident memory {outbox}: no such file (no alert was ever recorded there)")
    return outbox


def _open(alerts: Path | None, outbox: Path | None, k: int = 3) -> IncidentMemory:
    from logstream.memory.retrieval import IncidentMemory
    from logstream.memory.settings import IncidentMemorySettings

    return IncidentMemory(database(alerts, outbox), IncidentMemorySettings(k=k))


def _when(ts: float | None) -> str:
    from logstream.alerts.config import rfc3339

    return rfc3339(ts) if ts else "-"


def describe(incident: Incident, verdicts: tuple[Feedback, ...] | list[Feedback], head: str = "") -> str:
    """An incident for a reader: when, where, what, and what operators said and did."""
    lines = [
        f"{head}{incident.fingerprint}  {_when(incident.starts_at)} .. {_when(incident.ends_at)}"
        f"  {incident.state}  anomalies: {incident.count}  streams: {', '.join(incident.streams) or '-'}",
        *(f"    template: {t}" for t in incident.templates),
        *(f"    example: {e}" for e in incident.examples[:1]),
        *(
            f"    verdict: {f.verdict}"
            + (f' "{f.comment}"' if f.comment else "")
            + f" ({f.created_by or '?'},"
            f" {_when(f.created_at)})"
            for f in verdicts
        ),
    ]
    if incident.resolution:
        by = f" ({incident.resolved_by or '?'}, {_when(incident.resolved_at)})"
        lines.append(f"    resolution: {incident.resolution}{by}")
    return "\n".join(lines)


def _write(found: list[PastIncident], json_output: bool) -> None:
    for past in found:
        if json_output:
            sys.stdout.write(json.dumps(past.to_json()) + "\n")
        else:
            sys.stdout.write(describe(past.incident, past.verdicts, f"{past.similarity:.2f}  ") + "\n")


@app.command("search")
def search_command(
    text: Annotated[str, typer.Argument(help="Words or a log line to look for.")],
    alerts: AlertsOpt = None,
    outbox: OutboxOpt = None,
    model: Annotated[
        Path | None,
        typer.Option(help="The model that raised the alerts: compare its embedding of the text too."),
    ] = None,
    k: Annotated[int, typer.Option("-k", min=1, max=100, help="How many incidents to show.")] = 3,
    json_output: JsonOpt = False,
) -> None:
    """The past incidents most like some text, best first, with their verdicts and resolutions."""
    from logstream.text.normalize import Normalizer

    memory = _open(alerts, outbox, k)
    try:
        embedding, normalizer = None, Normalizer()
        if model is not None:
            from logstream.memory.embedding import LineEmbedder

            embedder = LineEmbedder.load(model)
            embedding, normalizer = embedder.embed_incident([text]), embedder.normalizer
        found = memory.search([normalizer.mask(text)], embedding)
        if not found:
            sys.stderr.write(f"no similar incident among {len(memory.index)} in {memory.store.path}\n")
        _write(found, json_output)
    finally:
        memory.close()


@app.command("show")
def show_command(
    fingerprint: Annotated[str, typer.Argument(help="An alert's fingerprint (dedup_key, `logstream-...`).")],
    alerts: AlertsOpt = None,
    outbox: OutboxOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """One incident, what operators said and did about it, then the past incidents most like it."""
    from logstream.memory.store import UnknownIncident

    memory = _open(alerts, outbox)
    try:
        incident = memory.store.get(fingerprint)
        if incident is None:
            raise UnknownIncident(f"fingerprint {fingerprint}: no such incident in {memory.store.path}")
        verdicts = memory.store.verdicts_for(incident)
        if json_output:
            body = incident.to_json() | {"verdicts": [f.to_json() for f in verdicts]}
            sys.stdout.write(json.dumps(body) + "\n")
        else:
            sys.stdout.write(describe(incident, verdicts) + "\n")
        similar = memory.similar(fingerprint)
        if similar and not json_output:
            sys.stdout.write("similar past incidents:\n")
        _write(similar, json_output)
    finally:
        memory.close()


@app.command("resolve")
def resolve_command(
    fingerprint: Annotated[str, typer.Argument(help="An alert's fingerprint (dedup_key, `logstream-...`).")],
    message: Annotated[str, typer.Option("--message", "-m", help="What it was and what was done.")],
    alerts: AlertsOpt = None,
    outbox: OutboxOpt = None,
    by: Annotated[str, typer.Option(help="Who (default: the current user).")] = "",
) -> None:
    """Write what an incident was and what was done; later alerts like it carry this."""
    from logstream.alerts.cli import _user

    memory = _open(alerts, outbox)
    try:
        incident = memory.resolve(fingerprint, message, by or _user())
    finally:
        memory.close()
    sys.stdout.write(f"{incident.fingerprint}: resolution recorded\n")
