"""Dynamic sinks: `train --from MODEL --prompt-only` rebuilds the pattern prompt (the
attention sinks) from the templates now common in the stream, as a new model version with the
parent's weights and tails fitted again; the parent is never edited in place."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from logstream.consumers.inputs import parse_lines
from logstream.detector import Detector
from logstream.evaluation.synth import STREAM_KEY, after_format_change, generate_lines


def _train(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstream", "train", *map(str, args)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def worker_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if " http: " not in line]


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def refreshed(synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """(the new version, the parent's digest before, the command's summary) after a deploy
    reworded three of the workers' templates: the prompt is rebuilt from the workers' new-format
    traffic (the web tier's `http` lines, the most common, would fill the sink budget unchanged)."""
    tmp = tmp_path_factory.mktemp("sinks")
    log = tmp / "after.log"
    log.write_text("\n".join(worker_lines(after_format_change(generate_lines(2400, seed=31)).lines)) + "\n")
    before = _digest(synthetic_model_dir)
    out = tmp / "v2"
    result = _train(
        log, "--from", synthetic_model_dir, "--prompt-only", "--out", out, "--stream-key", STREAM_KEY
    )
    assert result.returncode == 0, result.stderr
    assert _digest(synthetic_model_dir) == before, "the parent was edited in place"
    return out, json.loads((synthetic_model_dir / "logstream.json").read_text()), result.stderr


def test_the_new_version_has_the_new_prompt_and_the_same_weights(
    refreshed: tuple[Path, dict, str], synthetic_model_dir: Path
) -> None:
    out, parent, summary = refreshed
    meta = json.loads((out / "logstream.json").read_text())
    assert meta["prompt_refreshed"] and meta["parent"].startswith(synthetic_model_dir.name)
    assert "pattern prompt rebuilt from" in summary
    old, new = parent["pattern_prompt"], meta["pattern_prompt"]
    assert any("complete" in t or "status=healthy" in t for t in new)  # the new wording is a sink
    assert not any("complete" in t or "status=healthy" in t for t in old)
    weights = [load_file(d / "model.safetensors") for d in (synthetic_model_dir, out)]
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])
    assert meta["calibration"] != parent["calibration"]  # tails fitted again: the sinks changed
    assert meta["calibration"]["config"] == parent["calibration"]["config"]  # its scoring kept
    # the rarity starts from the new lines' counts; each template the parent knew counts once more
    assert len(meta["template_counts"]) == len(meta["templates"])
    lines = len(worker_lines(after_format_change(generate_lines(2400, seed=31)).lines))
    assert sum(meta["template_counts"]) == lines + len(parent["templates"])


def test_the_new_version_scores_with_its_own_sinks(
    refreshed: tuple[Path, dict, str], synthetic_model_dir: Path
) -> None:
    """Loaded like any model; its sinks are the new prompt's tokens, and new-format traffic
    is scored by it without alerting on most lines."""
    out, _, _ = refreshed
    detector, parent = Detector.load(out, device="cpu"), Detector.load(synthetic_model_dir, device="cpu")
    sinks = zip(detector.engine.sink_k, parent.engine.sink_k, strict=True)  # per layer [Hkv, S, D]
    assert not any(new.equal(old) for new, old in sinks)  # other sink keys: the new prompt
    lines = worker_lines(after_format_change(generate_lines(1200, seed=32)).lines)
    scored = detector.score(parse_lines(lines, STREAM_KEY))
    assert len(scored) == len(lines)
    assert sum(s.is_anomaly for s in scored) <= 0.02 * len(lines)


def test_prompt_only_needs_a_model_to_start_from(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("a line\n")
    result = _train(log, "--prompt-only", "--out", tmp_path / "m")
    assert result.returncode == 2 and "--prompt-only needs --from" in result.stderr
