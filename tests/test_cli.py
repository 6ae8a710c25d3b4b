"""The CLI contract: `logstream train` writes a model directory; --version and a fast --help;
no foreign progress bars; bad input or a wrong path is one line and exit code 2 (before torch
loads), with what it quotes escaped. `logstream replay`'s output is in tests/test_replay.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from cli_support import UNSAFE, assert_one_line_error, logstream, write_lines

from logstream.evaluation.synth import generate_lines
from logstream.scoring.evidence import LINE_TOP_K, SESSION_TOP_K


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


def test_an_error_quoting_a_path_escapes_its_control_characters(tmp_path: Path) -> None:
    """An error that quotes user text (here a file name with an escape sequence) prints it
    escaped: one line, no control character on stderr."""
    result = logstream("replay", tmp_path / "evil\x1b]0;pwned\x07.log")
    assert_one_line_error(result, "no such file")
    assert UNSAFE.search(result.stderr) is None and "\\x1b]0;pwned\\x07" in result.stderr


def test_train_from_prints_the_new_data_s_log_times_for_a_person(cli_model: Path, tmp_path: Path) -> None:
    """`train --from` says the new data's log time span as dates in UTC, not unix seconds."""
    path = write_lines(tmp_path / "new.log", generate_lines(300, seed=17).lines)
    result = logstream("train", path, "--from", cli_model, "--out", tmp_path / "m2", "--max-steps", "2")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert re.search(r"log time 2026-11-02 08:00:\d\d to 2026-11-02 08:\d\d:\d\d UTC", said), said
    assert "'first'" not in said
