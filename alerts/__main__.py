"""`python -m logstream.alerts`: check a routes file, run the delivery worker, add a silence.

    python -m logstream.alerts check   --routes configs/alerts.yaml [--resolve-secrets]
    python -m logstream.alerts deliver --routes configs/alerts.yaml [--until-idle]
    python -m logstream.alerts silence --routes configs/alerts.yaml \\
        --match 'stream=~"hdfs-.*"' --match severity=warning --for 2h --comment "deploy"

`check` needs no secrets unless --resolve-secrets. `silence` stores the silence in
the outbox database (`logstream alerts silence list|expire` show and end them).
Errors are one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import getpass
import signal
import sys
import threading
from collections.abc import Sequence

from logstream.alerts.cli import add_silence
from logstream.alerts.config import AlertConfigError, load_config, parse_duration, rfc3339
from logstream.alerts.delivery import DeliveryWorker
from logstream.alerts.outbox import Outbox, OutboxError


def deliver_command(routes: str, until_idle: bool) -> int:
    """Run the worker on the routes file's outbox until SIGTERM/SIGINT (or idle)."""
    config = load_config(routes)
    outbox = Outbox(config.delivery.outbox, config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        DeliveryWorker(outbox).run(stop, until_idle=until_idle)
    finally:
        outbox.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m logstream.alerts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a routes file")
    check.add_argument("--routes", required=True)
    check.add_argument("--resolve-secrets", action="store_true", help="also resolve ${ENV} and file: secrets")
    deliver = sub.add_parser("deliver", help="run the delivery worker on the outbox")
    deliver.add_argument("--routes", required=True)
    deliver.add_argument("--until-idle", action="store_true", help="exit when nothing is pending")
    silence = sub.add_parser("silence", help="mute matching alerts for a while")
    silence.add_argument("--routes", required=True)
    silence.add_argument("--match", action="append", required=True, metavar='LABEL="VALUE"')
    silence.add_argument("--for", dest="duration", required=True, help="e.g. 30m, 2h")
    silence.add_argument("--comment", default="")
    silence.add_argument("--by", default=getpass.getuser())
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            config = load_config(args.routes, secrets=args.resolve_secrets)
            sys.stdout.write(f"{args.routes}: ok, {len(config.receivers)} receiver(s)\n")
            return 0
        if args.command == "deliver":
            return deliver_command(args.routes, args.until_idle)
        made = add_silence(
            args.routes, args.match, parse_duration(args.duration), comment=args.comment, by=args.by
        )
        sys.stdout.write(f"{made.id}: silenced until {rfc3339(made.expires_at)}\n")
        return 0
    except (AlertConfigError, OutboxError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
