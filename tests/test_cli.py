"""The CLI contract: a train + replay round trip, output people can act on (groups, 1-based line
numbers, JSON-only stdout, no foreign progress bars, a fast --help), and bad input as one line
with exit code 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.scoring.evidence import LINE_TOP_K, SESSION_TOP_K

ALWAYS_KEYS = {"lines", "streams", "anomalies", "threshold", "lines_per_second", "peak_cache_bytes"}
LABEL_KEYS = {"precision", "recall", "f1", "best_f1", "auc_roc", "auc_pr"}


def logstream(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained through `logstream train` (few steps: this tests the contract, not quality)."""
    tmp = tmp_path_factory.mktemp("cli")
    baseline = write_lines(tmp / "baseline.log", generate_lines(800, seed=11).lines)
    out = tmp / "model"
    result = logstream(
        "train", baseline, "--out", out, "--preset", "tiny", "--window", "64",
        "--max-steps", "20", "--stream-key", STREAM_KEY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (tmp / "train.stderr").write_text(result.stderr)  # for test_no_hugging_face_progress_bars
    return out


def test_train_writes_a_model_directory(cli_model: Path) -> None:
    """train writes safetensors, a tokenizer and logstream.json with hash, preset, rules, prompt, calibration."""
    assert list(cli_model.glob("*.safetensors"))
    assert (cli_model / "tokenizer.json").is_file()
    meta = json.loads((cli_model / "logstream.json").read_text())
    for key in (
        "version",
        "data_sha256",
        "preset",
        "mask_rules",
        "pattern_prompt",
        "calibration",
        "created_at",
    ):
        assert key in meta
    assert meta["preset"] == "tiny" and meta["window"] == 64
    assert (
        meta["calibration"]["line"]["samples"] > 0 and meta["calibration"]["config"]["false_alarm_rate"] > 0
    )


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


def test_sessions_score_the_mean_of_all_words_by_default(cli_model: Path, tmp_path: Path) -> None:
    """`train --format sessions` saves the sessions' line score (the mean of all words), raw lines
    keep the top 3, and an explicit --line-top-k wins over either."""

    def line_top_k(model: Path) -> int:
        return json.loads((model / "logstream.json").read_text())["calibration"]["config"]["line_top_k"]

    sessions = [{"session": f"s{i}", "lines": generate_lines(6, seed=i).lines} for i in range(40)]
    path = write_lines(tmp_path / "sessions.jsonl", [json.dumps(s) for s in sessions])
    tiny = ("--preset", "tiny", "--window", "64", "--max-steps", "5")
    for extra, want in (((), SESSION_TOP_K), (("--line-top-k", "5"), 5)):
        out = tmp_path / f"model{len(extra)}"
        result = logstream("train", path, "--format", "sessions", "--out", out, *tiny, *extra)
        assert result.returncode == 0, result.stderr
        assert line_top_k(out) == want
    assert line_top_k(cli_model) == LINE_TOP_K != SESSION_TOP_K


def assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_empty_file_is_an_error(cli_model: Path, tmp_path: Path) -> None:
    """An empty input file: one line, exit 2."""
    path = tmp_path / "empty.log"
    path.write_text("")
    assert_one_line_error(logstream("replay", path, "--model", cli_model), "empty")


def test_binary_file_is_an_error(cli_model: Path, tmp_path: Path) -> None:
    """A binary file (NUL bytes): one line, exit 2."""
    path = tmp_path / "core.bin"
    path.write_bytes(bytes(range(256)) * 16)
    assert_one_line_error(logstream("replay", path, "--model", cli_model), "binary")


def test_missing_model_dir_is_an_error(tmp_path: Path) -> None:
    """A model directory that does not exist: one line, exit 2."""
    path = write_lines(tmp_path / "x.log", ["a line"])
    assert_one_line_error(logstream("replay", path, "--model", tmp_path / "nope"), "does not exist")


def test_foreign_model_dir_is_an_error(tmp_path: Path) -> None:
    """A directory that is not a logstream model (say, another project's checkpoint): one line, exit 2."""
    foreign = tmp_path / "bert"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (foreign / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    path = write_lines(tmp_path / "x.log", ["a line"])
    assert_one_line_error(logstream("replay", path, "--model", foreign), "not a logstream model directory")


def test_label_count_mismatch_is_an_error(cli_model: Path, tmp_path: Path) -> None:
    """Labels whose count differs from the input's lines: one line, exit 2."""
    path = write_lines(tmp_path / "x.log", generate_lines(10, seed=1).lines)
    labels = write_lines(tmp_path / "labels.txt", ["0"] * 7)
    assert_one_line_error(
        logstream("replay", path, "--model", cli_model, "--labels", labels), "counts must match"
    )


def test_invalid_utf8_and_huge_lines_are_counted_not_fatal(cli_model: Path, tmp_path: Path) -> None:
    """Invalid UTF-8 and a 1 MB line are counted in bad_input by serve's reject kinds and
    skipped, as serve skips them; the rest is scored, no crash."""
    good = generate_lines(20, seed=2).lines
    path = tmp_path / "messy.log"
    path.write_bytes(
        "\n".join(good[:10]).encode() + b"\nweb-1 INFO bad \xff\xfe bytes\n" + b"x" * 1_000_000 + b"\n"
        + "\n".join(good[10:]).encode() + b"\n"
    )  # fmt: skip
    result = logstream("replay", path, "--model", cli_model, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["bad_input"] == {"undecodable": 1, "oversized": 1}
    assert summary["lines"] == 20


def test_unknown_preset_is_cli_misuse(tmp_path: Path) -> None:
    """A wrong flag value is CLI misuse: exit 2, one clear line."""
    path = write_lines(tmp_path / "x.log", ["a line"] * 30)
    assert_one_line_error(logstream("train", path, "--out", tmp_path / "m", "--preset", "huge"), "--preset")


def test_version() -> None:
    """--version prints the package version and exits 0 (also as `python -m logstream`)."""
    from logstream import __version__

    result = logstream("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"logstream {__version__}"
    as_module = subprocess.run(
        [sys.executable, "-m", "logstream", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert as_module.returncode == 0 and as_module.stdout == result.stdout


def test_help_does_not_import_torch() -> None:
    """--help (and every command's --help) loads neither torch nor transformers: they are imported
    only inside the commands that need them, so help answers at once."""
    code = (
        "import sys\n"
        "from logstream.cli import main\n"
        "for args in (['--help'], ['replay', '--help'], ['train', '--help'], ['demo', '--help']):\n"
        "    sys.argv = ['logstream', *args]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout and "--report" in result.stdout


def test_wrong_paths_fail_before_torch_loads(cli_model: Path, tmp_path: Path) -> None:
    """A wrong input, labels file, model directory or multi-line pattern is refused, one line
    and exit 2, before the command imports torch or transformers (seconds): a typo answers at
    once. Each message says what the path is (missing, a directory, a file where a directory
    belongs, a store with no live version) and what to do."""
    log = write_lines(tmp_path / "x.log", ["a line"])
    store = tmp_path / "store"
    (store / "versions").mkdir(parents=True)
    cases = [
        (["replay", tmp_path / "missing.log", "--model", cli_model], "no such file; check the path"),
        (["replay", tmp_path, "--model", cli_model], f"{tmp_path}: is a directory, not a log file"),
        (["replay", log, "--model", tmp_path / "nope"], "does not exist; train one: logstream train"),
        (["replay", log, "--model", cli_model / "model.safetensors"], "is a file, not a model directory"),
        (["replay", log, "--model", store], "nothing promoted yet (logstream models promote)"),
        (["replay", log, "--model", cli_model, "--labels", tmp_path / "missing.labels"], "no such file"),
        (["replay", log, "--multiline", r"start:(a)\1"], "RE2 cannot run it"),
        (["train", tmp_path / "missing.log", "--out", tmp_path / "m"], "no such file"),
        (["train", log, "--out", tmp_path / "m", "--from", tmp_path / "nope"], "does not exist"),
        (["tail", log, "--model", tmp_path / "nope"], "does not exist"),
        (
            ["tail", tmp_path / "missing.log", "--model", cli_model],
            "no such file; tail follows a file that exists",
        ),
        (["tail", tmp_path, "--model", cli_model], "is a directory; give the log files in it"),
    ]
    code = (
        "import json, sys\n"
        "from logstream.cli import main\n"
        "sys.argv = ['logstream', *json.loads(sys.argv[1])]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    for args, needle in cases:
        result = subprocess.run(
            [sys.executable, "-c", code, json.dumps(list(map(str, args)))],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 2 and needle in result.stderr, (args, result.stderr)
        assert "HEAVY []" in result.stdout, (args, result.stdout)


def test_preset_names_match_the_model_presets() -> None:
    """The CLI's preset names (kept so --help need not import torch) are the model's presets."""
    from logstream.cli import PRESET_NAMES
    from logstream.engine.model import PRESETS

    assert tuple(PRESETS) == PRESET_NAMES


def test_no_hugging_face_progress_bars(cli_model: Path, tmp_path: Path) -> None:
    """Neither training (writing shards) nor loading a model (loading weights) shows HF/tqdm bars."""
    path = write_lines(tmp_path / "x.log", generate_lines(30, seed=3).lines)
    result = logstream("replay", path, "--model", cli_model, "--json")
    assert result.returncode == 0, result.stderr
    for stderr in (result.stderr, (cli_model.parent / "train.stderr").read_text()):
        assert "Loading weights" not in stderr and "Writing model shards" not in stderr
        assert "it/s]" not in stderr  # tqdm's rate suffix


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


# what a hostile log writer puts in a line: a window title, a screen clear, a link whose text
# hides where it goes, a bell, a right-to-left override
HOSTILE = [
    "2026-11-02T09:00:00.000Z web-1 ERROR \x1b]0;you have been pwned\x07 title set",
    "2026-11-02T09:00:01.000Z web-1 ERROR \x1b[2J\x1b[H screen cleared",
    "2026-11-02T09:00:02.000Z web-1 ERROR \x1b]8;;http://evil.example/\x1b\\click here\x1b]8;;\x1b\\ to log in",
    "2026-11-02T09:00:03.000Z web-1 ERROR file \u202egpj.exe",
]
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")  # what a terminal would act on


def test_replay_escapes_control_sequences_from_log_lines(cli_model: Path, tmp_path: Path) -> None:
    """Lines carrying terminal escape sequences (OSC title, screen clear, OSC 8 link, bidi
    override) reach the replay table escaped: stdout holds no control character, and the
    sequences show as text (`\\x1b]0;`)."""
    path = write_lines(tmp_path / "hostile.log", [*generate_lines(30, seed=4).lines, *HOSTILE])
    result = logstream("replay", path, "--model", cli_model, "--threshold", "0")
    assert result.returncode == 0, result.stderr
    assert UNSAFE.search(result.stdout) is None
    assert "\\x1b]0;" in result.stdout and "\\x1b[2J" in result.stdout and "\\u202e" in result.stdout


def test_an_error_quoting_a_path_escapes_its_control_characters(tmp_path: Path) -> None:
    """An error that quotes user text (here a file name with an escape sequence) prints it
    escaped: one line, no control character on stderr."""
    result = logstream("replay", tmp_path / "evil\x1b]0;pwned\x07.log")
    assert_one_line_error(result, "no such file")
    assert UNSAFE.search(result.stderr) is None and "\\x1b]0;pwned\\x07" in result.stderr


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


def test_train_from_prints_the_new_data_s_log_times_for_a_person(cli_model: Path, tmp_path: Path) -> None:
    """`train --from` says the new data's log time span as dates in UTC, not unix seconds."""
    path = write_lines(tmp_path / "new.log", generate_lines(300, seed=17).lines)
    result = logstream("train", path, "--from", cli_model, "--out", tmp_path / "m2", "--max-steps", "2")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert re.search(r"log time 2026-11-02 08:00:\d\d to 2026-11-02 08:\d\d:\d\d UTC", said), said
    assert "'first'" not in said
