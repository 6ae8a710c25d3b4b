"""`replay --feedback` and `tail --feedback` obey operators' verdicts as serve does.

A verdict is given with the real `logstream feedback` command into a real SQLite file; the
drivers run as subprocesses on the shared tiny synthetic model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import logstream

from logstream.evaluation.synth import generate_lines

INCIDENT = "connection pool exhausted"  # the synthetic new_template incident: it alerts


def scored(log: Path, model: Path, *extra: str | Path) -> dict[int, dict]:
    """`replay --model`: line number -> its --out row."""
    out = log.with_suffix(".scores.jsonl")
    result = logstream("replay", log, "--model", model, "--out", out, "--json", *extra)
    assert result.returncode == 0, result.stderr
    return {row["line"]: row for row in map(json.loads, out.read_text().splitlines())}


def tailed(log: Path, model: Path, *extra: str | Path) -> set[str]:
    """`tail --once --json`: the texts of the lines it printed as anomalies."""
    result = logstream("tail", log, "--model", model, "--once", "--json", *extra)
    assert result.returncode == 0, result.stderr
    return {json.loads(line)["line"] for line in result.stdout.splitlines() if line.startswith("{")}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = generate_lines(300, seed=5, incidents=("new_template",)).lines
    path = tmp_path_factory.mktemp("feedback") / "app.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_and_tail_obey_a_normal_verdict(log: Path, synthetic_model_dir: Path, tmp_path: Path) -> None:
    """The incident alerts in replay and tail; after `logstream feedback normal` on it, both
    run with `--feedback` leave it silent, and a run without `--feedback` still alerts."""
    rows = scored(log, synthetic_model_dir)
    incident = next(n for n, row in rows.items() if INCIDENT in row["text"])
    assert rows[incident]["anomaly"] and INCIDENT in " ".join(tailed(log, synthetic_model_dir))
    db = tmp_path / "outbox.sqlite"
    given = logstream(
        "feedback", "normal", "--db", db, "--at", f"{log}:{incident}", "--model", synthetic_model_dir, "-c", "a drill"
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert not scored(log, synthetic_model_dir, "--feedback", db)[incident]["anomaly"]
    assert INCIDENT not in " ".join(tailed(log, synthetic_model_dir, "--feedback", db))
    assert scored(log, synthetic_model_dir)[incident]["anomaly"]


def test_replay_and_tail_obey_an_anomaly_verdict(
    log: Path, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A line that does not alert alerts in replay and tail once its template is confirmed as an
    anomaly, whatever its score."""
    rows = scored(log, synthetic_model_dir)
    quiet = next(n for n, row in sorted(rows.items()) if not row["anomaly"] and "finished in" in row["text"])
    db = tmp_path / "outbox.sqlite"
    given = logstream(
        "feedback", "anomaly", "--db", db, "--at", f"{log}:{quiet}", "--model", synthetic_model_dir
    )
    assert given.returncode == 0, given.stderr
    assert scored(log, synthetic_model_dir, "--feedback", db)[quiet]["anomaly"]
    assert rows[quiet]["text"] in tailed(log, synthetic_model_dir, "--feedback", db)


def test_a_verdict_holds_on_a_pipe_separated_layout(
    log: Path, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """In a layout whose fields are separated by `|` (`<time>|<source>|<level>|<message>`, as
    HealthApp writes), the template `feedback --at` stores has spaces where the line has pipes,
    as the miner splits there: a "normal" verdict on an alerting line still covers it in replay
    and tail."""
    piped = tmp_path / "piped.log"
    piped.write_text("".join(line.replace(" ", "|", 3) + "\n" for line in log.read_text().splitlines()))
    rows = scored(piped, synthetic_model_dir)
    loud = next(n for n, row in sorted(rows.items()) if row["anomaly"] and "finished in" in row["text"])
    assert rows[loud]["text"] in tailed(piped, synthetic_model_dir)
    db = tmp_path / "outbox.sqlite"
    given = logstream(
        "feedback", "normal", "--db", db, "--at", f"{piped}:{loud}", "--model", synthetic_model_dir
    )
    assert given.returncode == 0, given.stderr
    assert not scored(piped, synthetic_model_dir, "--feedback", db)[loud]["anomaly"]
    assert rows[loud]["text"] not in tailed(piped, synthetic_model_dir, "--feedback", db)


def test_a_missing_feedback_database_is_one_line(
    log: Path, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """`--feedback` names a file that must exist (verdicts are read, never created here)."""
    result = logstream("replay", log, "--model", synthetic_model_dir, "--feedback", tmp_path / "nope.sqlite")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--feedback" in result.stderr and "no such file" in result.stderr
