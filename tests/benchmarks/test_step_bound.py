"""benchmarks/step_bound.py: what the attention would have to reach for the whole CPU step to
reach a share of the roofline. The arithmetic and the step it times; no speed is asserted
(docs/benchmarks.md holds the figures)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import ModuleType

import pytest
from benchmarks_support import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def step_bound() -> ModuleType:
    return load_benchmark("step_bound")


def test_needed_share_is_what_is_left_of_the_goals_time(step_bound: ModuleType) -> None:
    """A step of 100 GFLOP at half of a 100 GFLOP/s roofline takes 2 s; with 0.3 s of other
    parts, attention's 70 GFLOP must run in 1.7 s: 41.2 GFLOP/s, 41.2% of the roofline."""
    share = step_bound.needed_share(100e9, 70e9, 0.3, 100e9, 0.5)
    assert share == pytest.approx(70 / 1.7 / 100)
    assert step_bound.needed_share(100e9, 70e9, 0.0, 100e9, 0.5) == pytest.approx(0.35)
    assert math.isinf(step_bound.needed_share(100e9, 70e9, 2.0, 100e9, 0.5))  # nothing left for it


@pytest.mark.parametrize(
    ("op", "part"),
    [
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::mm", "gemm"),
        ("aten::addmm", "gemm"),
        ("aten::matmul", "rest"),  # the wrapper's own time is overhead, its mm is counted
        ("aten::index_select", "rest"),
    ],
)
def test_ops_fall_in_their_part(step_bound: ModuleType, op: str, part: str) -> None:
    assert step_bound.part_of(op) == part


def test_the_step_scores_every_token(step_bound: ModuleType) -> None:
    step, config = step_bound.full_ring_step("tiny", 128, streams=3, tokens=16, sinks=8)
    nll, last = step()
    assert nll.shape == (3, 16) and last.shape == (3, config.vocab_size)
    assert bool((nll > 0).all())  # no padding: every token of every stream is scored


def test_the_script_prints_its_parts_and_the_share_needed(step_bound: ModuleType) -> None:
    """End to end at tiny shapes: the parts add up to the step, and the shares follow from them
    (at these shapes the other parts may alone outlast the goal's step: then null)."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "step_bound.py"), "--preset", "tiny", "--window", "128",
         "--sinks", "8", "--streams", "2", "--tokens", "32", "--steps", "2", "--roofline-seconds", "0.03"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    out = json.loads(result.stdout.strip().splitlines()[-1])
    parts = out["part_seconds"]
    assert set(parts) == {"attention", "gemm", "rest"} and min(parts.values()) > 0
    assert sum(parts.values()) == pytest.approx(out["step_seconds"])
    flops, roof = out["part_flops"], out["roofline_fp32"]

    def needed(other: float) -> float | None:
        share = step_bound.needed_share(out["step_flops"], flops["attention"], other, roof, 0.5)
        return share if math.isfinite(share) else None

    assert out["attention_share_needed"] == {
        "rest_as_measured": needed(parts["gemm"] + parts["rest"]),
        "rest_free": needed(parts["gemm"]),
    }
    assert "Attention would need" in result.stdout
