"""`python -m logstream.alerts ...` is `logstream alerts ...`: one CLI (logstream.alerts.cli).

    python -m logstream.alerts check configs/alerts.yaml [--resolve-secrets]
    python -m logstream.alerts deliver --alerts configs/alerts.yaml [--until-idle]
    python -m logstream.alerts silence add --alerts configs/alerts.yaml -m 'stream=~"hdfs-.*"' --for 2h

Errors a user can fix are one line on stderr with exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from logstream.alerts.cli import app


def main(argv: Sequence[str] | None = None) -> int:
    """Run the alerts CLI on `argv` (default: the command line); its exit status."""
    try:
        code = app(
            args=list(argv) if argv is not None else None,
            prog_name="python -m logstream.alerts",
            standalone_mode=False,
        )
    except click.ClickException as exc:  # a usage error: click's own one-line message, exit 2
        exc.show()
        return exc.exit_code
    return code if isinstance(code, int) else 0  # click returns an Exit's code, else None


if __name__ == "__main__":
    sys.exit(main())
