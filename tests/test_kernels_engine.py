"""A replay scores the same through the Triton kernels as through the torch reference.

The kernel path runs in a worker under TRITON_INTERPRET=1 with
LOGSTREAM_FORCE_TRITON=1 (kernels_support.py); the reference path runs
here. Same model directory, same input, streams long enough to wrap the ring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernels_support import Interpreter

from logstream.replay import ReplayOptions, run_replay
from logstream.synth import STREAM_KEY, generate_lines


def replay_scores(input_path: Path, model_dir: Path) -> list[float]:
    """Line scores of `logstream replay --model model_dir` over input_path, in input order."""
    report = run_replay(ReplayOptions(input=input_path, model=model_dir, stream_key=STREAM_KEY))
    return [u.score for u in sorted(report.units, key=lambda u: u.index)]


def test_replay_scores_agree_kernel_vs_reference(serve_model_dir: Path, tmp_path: Path) -> None:
    """Every line score agrees to 1e-3 relative, with wrap-around and incidents in the input."""
    log = generate_lines(120, seed=7, incidents=("new_template", "burst"))
    path = tmp_path / "replay.log"
    path.write_text("\n".join(log.lines) + "\n")
    want = replay_scores(path, serve_model_dir)
    worker = Interpreter()
    try:
        got = worker.call("test_kernels_engine:replay_scores", path, serve_model_dir, timeout=900)
    finally:
        worker.close()
    assert len(got) == len(want) == len(log.lines)
    assert got == pytest.approx(want, rel=1e-3)
