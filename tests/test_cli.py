"""The CLI contract: a train + replay round trip, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    """replay --json ends stdout with one JSON object holding the contract's keys, metrics included."""
    log = generate_lines(300, seed=12, incidents=INCIDENT_KINDS)
    path = write_lines(tmp_path / "test.log", log.lines)
    labels = write_lines(tmp_path / "labels.txt", [str(x) for x in log.labels])
    scores = tmp_path / "scores.jsonl"
    result = logstream(
        "replay", path, "--model", cli_model, "--labels", labels, "--stream-key", STREAM_KEY,
        "--out", scores, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary.keys() >= ALWAYS_KEYS | LABEL_KEYS
    assert summary["lines"] == len(log.lines)
    assert summary["streams"] == len({line.split()[1] for line in log.lines})
    assert len(scores.read_text().splitlines()) == len(log.lines)


def test_replay_without_model_trains_on_first_half(tmp_path: Path) -> None:
    """Without --model, replay trains on the first half and scores only the second."""
    path = write_lines(tmp_path / "all.log", generate_lines(400, seed=13).lines)
    result = logstream("replay", path, "--preset", "tiny", "--window", "64", "--max-steps", "10", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["lines"] == 200


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
    summary = json.loads(result.stdout.strip().splitlines()[-1])
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
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["streams"] == 20 and summary["unit"] == "session" and "auc_pr" in summary


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
    """Invalid UTF-8 and a 1 MB line are counted in bad_input and still scored; no crash."""
    good = generate_lines(20, seed=2).lines
    path = tmp_path / "messy.log"
    path.write_bytes(
        "\n".join(good[:10]).encode() + b"\nweb-1 INFO bad \xff\xfe bytes\n" + b"x" * 1_000_000 + b"\n"
        + "\n".join(good[10:]).encode() + b"\n"
    )  # fmt: skip
    result = logstream("replay", path, "--model", cli_model, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["bad_input"] == {"invalid_utf8": 1, "oversized_line": 1}
    assert summary["lines"] == 22


def test_unknown_preset_is_cli_misuse(tmp_path: Path) -> None:
    """A wrong flag value is CLI misuse: exit 2, one clear line."""
    path = write_lines(tmp_path / "x.log", ["a line"] * 30)
    assert_one_line_error(logstream("train", path, "--out", tmp_path / "m", "--preset", "huge"), "--preset")
