"""The stream key is saved with the model: replay (and tail) default to it, so a forgotten
--stream-key does not put every line into one `default` stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import logstream

from logstream.evaluation.synth import STREAM_KEY, generate_lines


@pytest.fixture(scope="module")
def keyed_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("stream-key")
    baseline, later = tmp / "baseline.log", tmp / "later.log"
    baseline.write_text("\n".join(generate_lines(600, seed=3).lines) + "\n")
    later.write_text("\n".join(generate_lines(300, seed=4).lines) + "\n")
    model = tmp / "model"
    result = logstream(
        "train", baseline, "--out", model, "--stream-key", STREAM_KEY,
        "--preset", "tiny", "--window", "64", "--max-steps", "10",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return model, later


def _streams(*args: str | Path) -> int:
    result = logstream("replay", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["streams"]


def test_replay_defaults_to_the_models_stream_key(keyed_model: tuple[Path, Path]) -> None:
    model, later = keyed_model
    assert json.loads((model / "logstream.json").read_text())["stream_key"] == STREAM_KEY
    explicit = _streams(later, "--model", model, "--stream-key", STREAM_KEY)
    assert explicit > 1
    assert _streams(later, "--model", model) == explicit
    assert _streams(later, "--model", model, "--stream-key", "(no such key)") == 1  # an explicit key wins
