"""The CLI contract: a train + replay round trip, output people can act on (groups, 1-based line
numbers, JSON-only stdout, no foreign progress bars, a fast --help), and bad input as one line
with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from logstream.scoring.evidence import LINE_TOP_K, SESSION_TOP_K
from logstream.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines

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


def test_replay_without_model_trains_on_first_half(tmp_path: Path) -> None:
    """Without --model, replay trains on the first half and scores only the second."""
    path = write_lines(tmp_path / "all.log", generate_lines(400, seed=13).lines)
    result = logstream("replay", path, "--preset", "tiny", "--window", "64", "--max-steps", "10", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["lines"] == 200


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
    """A missing input, labels file or model directory is refused, one line and exit 2, before
    the command imports torch or transformers (seconds): a typo answers at once."""
    log = write_lines(tmp_path / "x.log", ["a line"])
    cases = [
        (["replay", tmp_path / "missing.log", "--model", cli_model], "no such file"),
        (["replay", log, "--model", tmp_path / "nope"], "does not exist"),
        (["replay", log, "--model", cli_model, "--labels", tmp_path / "missing.labels"], "no such file"),
        (["train", tmp_path / "missing.log", "--out", tmp_path / "m"], "no such file"),
        (["train", log, "--out", tmp_path / "m", "--from", tmp_path / "nope"], "does not exist"),
        (["tail", log, "--model", tmp_path / "nope"], "does not exist"),
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
    from logstream.model import PRESETS

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
    (Spark_2k's first chunk at stop 16, scored by the model of the second: 88 of 1,000, where the
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
