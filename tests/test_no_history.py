"""The project speaks of itself, never of its development history.

README, docs, code, tests, benchmarks, configs and the chart describe what the software is
and does; what changed when lives in git log. A reference to a numbered development step
(the words stop, round or issue before a number, or a step named relative to now) or to a
design file outside the repository fails here, with the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (
    "README.md",
    "docs",
    "logstream",
    "tests",
    "benchmarks",
    "configs",
    "helm",
    ".ci",
    "pyproject.toml",
)
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".toml", ".txt", ".tpl", ".sh", ".cfg", ""}
HISTORY = re.compile(
    r"\b(?:stops?|rounds?|issues?)\s+#?\d+\b"  # a step word and its number
    r"|\b(?:before|after|since|until|at|this|last|previous|next|earlier)\s+(?:stop|round|session)\b"
    r"|\bissue\s+#"
    r"|(?<![\w/])DESIGN\.md\b",  # the design file outside the repository (docs/architecture.md is ours)
    re.IGNORECASE,
)


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [p for p in found if p.suffix in TEXT and p != Path(__file__).resolve()]
    return files


def test_the_scan_reads_the_project() -> None:
    """The scan finds the package, the docs and the chart (else the check below passes on nothing)."""
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {"README.md", "logstream/cli.py", "helm/logstream/values.yaml"} <= names
    number = 14  # the examples are built here, so that this file holds no reference itself
    assert all(HISTORY.search(f"as measured at {step} {number}") for step in ("stop", "round", "issue"))
    assert HISTORY.search(f"see issue #{number}")
    assert not HISTORY.search("HDFS block sessions stop early") and not HISTORY.search("Stop the service")


def test_no_development_history_in_the_project() -> None:
    """No file names a development step or a design file outside the repository."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in scanned_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if (match := HISTORY.search(line))
    ]
    assert found == [], f"{len(found)} references, e.g. {found[:10]}"
