"""`logstream replay`: output people can act on. One JSON object on stdout with --json; anomalies
grouped by template with 1-based line numbers as the file has them; what trained the model and
what was scored; a note on a chunk far past its false-alarm rate; log lines escaped; stack
traces as one record; sessions; a model store's live version."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import HOSTILE, UNSAFE, logstream, write_lines

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines

ALWAYS_KEYS = {"lines", "streams", "anomalies", "threshold", "lines_per_second", "peak_cache_bytes"}
LABEL_KEYS = {"precision", "recall", "f1", "best_f1", "auc_roc", "auc_pr"}


def test_replay_json_summary_with_labels(cli_model: Path, tmp_path: Path) -> None:
    """replay --json writes only one JSON object to stdout, holding the contract's keys and metrics;
    the table goes to stderr."""
    log = generate_lines(300, seed=12, incidents=INCIDENT_KINDS)
    path = write_lines(tmp_path / "test.log", log.lines)
    labels = write_lines(tmp_path / "labels.txt", [str(x) for x in log.labels])
    scores = tmp_path / "scores.jsonl"
    result = logstream(
        "replay", path, "--model", cli_model, "--labels", labels, "--stream-key", STREAM_KEY,
        "--out", scores, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # the whole of stdout: `| jq` works
    assert result.stdout.count("\n") == 1
    assert "anomalies by template" in result.stderr
    assert summary.keys() >= ALWAYS_KEYS | LABEL_KEYS
    assert summary["lines"] == len(log.lines)
    assert summary["streams"] == len({line.split()[1] for line in log.lines})
    assert len(scores.read_text().splitlines()) == len(log.lines)


@pytest.fixture(scope="module")
def auto_trained(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """`logstream replay FILE` on 400 lines, no --model and no --json: a new user's first run."""
    path = write_lines(tmp_path_factory.mktemp("first-run") / "all.log", generate_lines(400, seed=13).lines)
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "replay", str(path), "--preset", "tiny", "--window", "64",
         "--max-steps", "10"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "COLUMNS": "200"},  # a terminal wide enough that the bars show their counts
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def test_replay_says_before_scoring_which_lines_train_and_which_are_scored(
    auto_trained: subprocess.CompletedProcess[str],
) -> None:
    """Without --model, stderr says before the work which lines train the model, which are
    scored, that the first half is not, and how to score every line."""
    said = " ".join(auto_trained.stderr.split())  # the console wraps it
    assert "lines 1-200 (the first half) train a model and lines 201-400 are scored" in said
    assert "--auto-train all" in said and said.index("train a model") < said.index("scoring lines")


def test_replay_summary_says_what_trained_and_what_was_scored(
    auto_trained: subprocess.CompletedProcess[str],
) -> None:
    """The summary under the table says it again: the scored lines and the lines that trained
    the model, which were not scored, and how to score them all."""
    assert (
        "scored 200 lines (lines 201-400) with a model trained on lines 1-200, which are not scored "
        "(--auto-train all scores every line)" in auto_trained.stdout
    )


def test_replay_progress_counts_the_lines_to_score(auto_trained: subprocess.CompletedProcess[str]) -> None:
    """The scoring bar's total is the lines to score (200), so it ends full, not at 200/400."""
    assert re.search(r"scoring lines\s.*\b200/200\b", auto_trained.stderr)
    assert "/400" not in auto_trained.stderr


def test_replay_without_json_writes_no_json(auto_trained: subprocess.CompletedProcess[str]) -> None:
    """Without --json stdout holds the table and the summary lines, no JSON dump."""
    assert "anomalies by template" in auto_trained.stdout
    assert not any(line.lstrip().startswith(("{", '"')) for line in auto_trained.stdout.splitlines())


def test_replay_with_nothing_over_the_threshold_says_so_with_the_highest_score(
    cli_model: Path, tmp_path: Path
) -> None:
    """When no line crosses the threshold the summary says so and names the highest score
    seen, its line and how rare it is among normal lines; --json carries the same numbers."""
    path = write_lines(tmp_path / "calm.log", generate_lines(60, seed=21).lines)
    result = logstream(
        "replay", path, "--model", cli_model, "--threshold", "99", "--out", tmp_path / "s.jsonl"
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    worst = max(rows, key=lambda row: row["score"])
    said = re.search(
        r"nothing over the threshold 99\.00: the highest score was ([\d.]+) \(line (\d+)\)", result.stdout
    )
    assert said is not None, result.stdout
    assert (float(said.group(1)), int(said.group(2))) == (round(worst["score"], 2), worst["line"])


def test_replay_auto_train_all_scores_every_line(tmp_path: Path) -> None:
    """--auto-train all is prequential: every line is scored, each chunk by a model trained before it."""
    log = generate_lines(400, seed=14, incidents=INCIDENT_KINDS)
    path = write_lines(tmp_path / "all.log", log.lines)
    labels = write_lines(tmp_path / "labels.txt", [str(x) for x in log.labels])
    result = logstream(
        "replay", path, "--auto-train", "all", "--labels", labels, "--preset", "tiny", "--window", "64",
        "--max-steps", "5", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["lines"] == summary["scored"] == len(log.lines)
    assert summary["positives"] == sum(log.labels)


def test_replay_sessions_format(cli_model: Path, tmp_path: Path) -> None:
    """Sessions JSONL are scored one stream per session, with session-level metrics."""
    sessions = [
        {"session": f"s{i}", "lines": generate_lines(6, seed=i).lines, "label": int(i % 5 == 0)}
        for i in range(20)
    ]
    path = write_lines(tmp_path / "sessions.jsonl", [json.dumps(s) for s in sessions])
    result = logstream("replay", path, "--model", cli_model, "--format", "sessions", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["streams"] == 20 and summary["unit"] == "session" and "auc_pr" in summary


def test_replay_line_numbers_match_the_file_and_groups(cli_model: Path, tmp_path: Path) -> None:
    """Line numbers are 1-based and count empty lines, as an editor does; anomalies are grouped by
    template with count, first and last line, worst score and an explained example."""
    log = generate_lines(300, seed=12, incidents=INCIDENT_KINDS)
    file_lines = [*log.lines[:5], "", "   ", *log.lines[5:150], "", *log.lines[150:]]
    path = write_lines(tmp_path / "gaps.log", file_lines)
    scores = tmp_path / "scores.jsonl"
    result = logstream(
        "replay", path, "--model", cli_model, "--stream-key", STREAM_KEY, "--out", scores, "--json",
        "--threshold", "1.0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert len(rows) == len(log.lines)
    assert all(file_lines[row["line"] - 1] == row["text"] for row in rows)
    assert [row["index"] for row in rows] == list(range(len(log.lines)))
    summary = json.loads(result.stdout)
    groups = summary["groups"]
    assert groups and summary["anomaly_groups"] == len(groups)
    assert sum(g["count"] for g in groups) == summary["anomalies"]
    assert [g["worst_score"] for g in groups] == sorted((g["worst_score"] for g in groups), reverse=True)
    flagged = {row["line"]: row for row in rows if row["anomaly"]}
    for g in groups:
        assert g["first_line"] in flagged and g["last_line"] in flagged and g["first_line"] <= g["last_line"]
        assert flagged[g["worst_line"]]["text"] == g["example"]
        assert g["explanation"] is not None and g["explanation"]["summary"]
    assert len(groups) < summary["anomalies"]  # similar lines share a row


def test_replay_notes_a_chunk_with_far_more_alerts_than_its_false_alarm_rate() -> None:
    """A chunk with more than 5% of its items over the threshold gets a note on what that may be
    (as when Spark_2k's first chunk is scored by the model of the second: 88 of 1,000, where the
    threshold expects 0.3); a chunk with 14 of 1,000 gets none. The table shows each chunk's
    surprisal threshold."""
    from dataclasses import replace

    from rich.console import Console

    from logstream.cli import print_report
    from logstream.replay import ChunkModel, Columns, ReplayReport

    quiet = ChunkModel(first=1000, items=1000, train_lines=700, train_steps=200, window=128,
                       threshold=3.5229, raw_threshold=8.0, anomalies=14)  # fmt: skip
    shifted = replace(quiet, first=0, anomalies=88)
    report = ReplayReport(
        columns=Columns(), patterns=[], lines=2000, streams=1, threshold=3.5229, seconds=1.0,
        peak_cache_bytes=0, bad_input={}, unit="line", chunks=[shifted, quiet],
    )  # fmt: skip
    console = Console(record=True, width=400)
    print_report(report, [], console)
    rows = console.export_text().splitlines()
    notes = [line for line in rows if line.startswith("note:")]
    assert len(notes) == 1
    assert notes[0].startswith(
        "note: items 1-1000: 88 of 1,000 over the threshold, which expects 0.3 of normal"
    )
    assert "an incident that large, or lines its model never learned" in notes[0]
    assert not quiet.alerts_beyond_chance and shifted.alerts_beyond_chance
    assert any(" 8.00 " in row for row in rows)


def test_replay_escapes_control_sequences_from_log_lines(cli_model: Path, tmp_path: Path) -> None:
    """Lines carrying terminal escape sequences (OSC title, screen clear, OSC 8 link, bidi
    override) reach the replay table escaped: stdout holds no control character, and the
    sequences show as text (`\\x1b]0;`)."""
    path = write_lines(tmp_path / "hostile.log", [*generate_lines(30, seed=4).lines, *HOSTILE])
    result = logstream("replay", path, "--model", cli_model, "--threshold", "0")
    assert result.returncode == 0, result.stderr
    assert UNSAFE.search(result.stdout) is None
    assert "\\x1b]0;" in result.stdout and "\\x1b[2J" in result.stdout and "\\u202e" in result.stdout


JAVA_TRACE = [
    "java.lang.IllegalStateException: inventory service returned 503",
    "\tat com.example.orders.InventoryClient.reserve(InventoryClient.java:88)",
    "\tat com.example.orders.OrderService.place(OrderService.java:41)",
    "Caused by: java.net.SocketTimeoutException: Read timed out",
    "\tat java.base/sun.nio.ch.NioSocketImpl.timedRead(NioSocketImpl.java:288)",
    "\t... 12 more",
]


PYTHON_TRACE = [
    "Traceback (most recent call last):",
    '  File "/srv/app/payments.py", line 57, in charge',
    '    amount = order["amount"]',
    "KeyError: 'amount'",
]


def test_replay_scores_a_stack_trace_once_with_its_line_range(cli_model: Path, tmp_path: Path) -> None:
    """By default (`--multiline auto`) a Java trace and a Python traceback under the error
    lines that logged them are one scored record each: one row, from the error line to the
    trace's last line, explained in words; the normal lines around them stay rows of their own.
    A trace longer than the size cap is cut there, and the summary counts the cut."""
    lines = generate_lines(40, seed=31).lines
    long_trace = [f"\tat com.example.deep.Recursion.call(Recursion.java:{i})" for i in range(250)]
    java_at, python_at, long_at = 10, 20 + len(JAVA_TRACE), 30 + len(JAVA_TRACE) + len(PYTHON_TRACE)
    lines[java_at:java_at] = JAVA_TRACE
    lines[python_at:python_at] = PYTHON_TRACE
    lines[long_at:long_at] = long_trace
    scores = tmp_path / "scores.jsonl"
    path = write_lines(tmp_path / "traces.log", lines)
    result = logstream("replay", path, "--model", cli_model, "--threshold", "0", "--out", scores, "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["line"]: row for row in map(json.loads, scores.read_text().splitlines())}
    java = rows[java_at]  # 1-based: the error line just before the trace
    assert (java["last_line"], java["text"]) == (
        java_at + len(JAVA_TRACE),
        "\n".join(lines[java_at - 1 : java_at + 6]),
    )
    assert java["explanation"]["summary"].startswith(("the model's chance of", "no single word"))
    python = rows[python_at]
    assert python["last_line"] == python_at + len(PYTHON_TRACE)
    assert not any(java_at < line <= java["last_line"] for line in rows)  # no frame scored alone
    assert len(rows) == 40 + 1  # 40 lines, and the rest of the cut trace
    assert json.loads(result.stdout)["multiline"] == {"events": 4, "lines": 7 + 5 + 251, "cut": 1}


KUBECTL = [  # `kubectl logs --prefix -f -l app=orders`: two pods' lines interleaved
    "[pod/orders-1/app] 2026-11-20 10:00:01.332 ERROR c.e.orders.Api - order 7 failed",
    "[pod/orders-2/app] 2026-11-20 10:00:01.333 INFO c.e.orders.Api - GET /orders/8 200",
    "[pod/orders-1/app] java.lang.IllegalStateException: inventory service returned 503",
    "[pod/orders-2/app] 2026-11-20 10:00:01.334 INFO c.e.orders.Api - GET /orders/9 200",
    "[pod/orders-1/app] \tat com.example.orders.InventoryClient.reserve(InventoryClient.java:88)",
    "[pod/orders-1/app] Caused by: java.net.SocketTimeoutException: Read timed out",
    "[pod/orders-2/app] 2026-11-20 10:00:01.335 INFO c.e.orders.Api - GET /orders/10 200",
    "[pod/orders-1/app] \t... 12 more",
]


def test_replay_joins_an_interleaved_trace_per_stream_with_a_user_pattern(
    cli_model: Path, tmp_path: Path
) -> None:
    """A user pattern (RE2) names the continuation lines of prefixed pod logs; one pod's trace,
    interleaved with another pod's lines, becomes one record of its own stream, and the other
    pod's lines are never merged into it."""
    path = write_lines(tmp_path / "pods.log", KUBECTL)
    scores = tmp_path / "scores.jsonl"
    pattern = r"continue:^\[pod/[^\]]+\] (?:\s|Caused by: |[\w$.]+(?:Exception|Error)\b)"
    result = logstream(
        "replay", path, "--model", cli_model, "--stream-key", r"^\[pod/([^/]+)", "--multiline", pattern,
        "--threshold", "0", "--out", scores,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert [(row["stream"], row["line"], row["last_line"]) for row in rows] == [
        ("orders-1", 1, 8), ("orders-2", 2, 2), ("orders-2", 4, 4), ("orders-2", 7, 7),
    ]  # fmt: skip
    assert rows[0]["text"] == "\n".join(KUBECTL[i] for i in (0, 2, 4, 5, 7))


def test_replay_accepts_a_model_store_and_scores_with_its_live_version(
    cli_model: Path, tmp_path: Path
) -> None:
    """--model STORE scores with the store's live version (what serve would score with), and
    says which before scoring."""
    from logstream.lifecycle import model_store

    store = tmp_path / "store"
    model_store.add(store, cli_model)
    model_store.promote(store, model_store.add(store, cli_model))
    path = write_lines(tmp_path / "x.log", generate_lines(30, seed=5).lines)
    result = logstream("replay", path, "--model", store, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["chunks"][0]["model_id"].startswith("v0002@")
    assert f"with the model {store} (v0002@" in " ".join(result.stderr.split())
