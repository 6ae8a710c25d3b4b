"""`logstream replay` scores the same through the Triton kernels as through the torch reference.

The same command runs twice on the same model and input: once plainly (CPU:
the reference) and once with LOGSTREAM_FORCE_TRITON=1 and TRITON_INTERPRET=1,
which sends every ring write and attention through the Triton kernels in
Triton's interpreter. Streams are long enough to wrap the ring (window 128).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernels_support import INTERPRET_ENV

from logstream.evaluation.synth import STREAM_KEY, generate_lines


def replay_scores(input_path: Path, model_dir: Path, out: Path, env: dict[str, str]) -> list[float]:
    """Line scores written by `logstream replay --out`, in input order."""
    run = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "replay", str(input_path), "--model", str(model_dir),
         "--stream-key", STREAM_KEY, "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [row["score"] for row in sorted(rows, key=lambda row: row["index"])]


def test_replay_scores_agree_kernel_vs_reference(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """Every line score agrees to 1e-3 relative, with wrap-around and incidents in the input."""
    log = generate_lines(120, seed=7, incidents=("new_template", "burst"))
    path = tmp_path / "replay.log"
    path.write_text("\n".join(log.lines) + "\n")
    reference_env = {"LOGSTREAM_FORCE_TRITON": "0", "TRITON_INTERPRET": "0"}
    want = replay_scores(path, synthetic_model_dir, tmp_path / "reference.jsonl", reference_env)
    got = replay_scores(path, synthetic_model_dir, tmp_path / "triton.jsonl", INTERPRET_ENV)
    assert len(got) == len(want) == len(log.lines)
    assert got == pytest.approx(want, rel=1e-3)
