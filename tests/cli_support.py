"""Shared pieces of the tests that run the `logstream` command in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def logstream(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m logstream.cli ARGS` in a subprocess (bounded), its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    """CLI misuse: exit 2 and one stderr line that holds `needle`, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


# what a hostile log writer puts in a line: a window title, a screen clear, a link whose text
# hides where it goes, a bell, a right-to-left override
HOSTILE = [
    "2026-11-02T09:00:00.000Z web-1 ERROR \x1b]0;you have been pwned\x07 title set",
    "2026-11-02T09:00:01.000Z web-1 ERROR \x1b[2J\x1b[H screen cleared",
    "2026-11-02T09:00:02.000Z web-1 ERROR \x1b]8;;http://evil.example/\x1b\\click here\x1b]8;;\x1b\\ to log in",
    "2026-11-02T09:00:03.000Z web-1 ERROR file \u202egpj.exe",
]
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")  # what a terminal would act on
