"""The GPU benchmark's harness runs end to end on CPU (reference path, tiny sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_smoke_run_on_cpu() -> None:
    """`benchmarks/gpu.py --device cpu --quick` prints its tables and the KV-bytes check holds."""
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| torch reference |" in run.stdout
    assert "dense recompute" in run.stdout
    assert "KV bytes per stream = layers x 2 x L x kv_heads x head_dim x dtype size" in run.stdout
