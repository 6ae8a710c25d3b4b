"""benchmarks/roofline.py: the ceilings every speed benchmark divides by, and the FLOPs it counts.

Speed itself is never asserted (docs/benchmarks.md holds the figures)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from benchmarks_support import load_benchmark
from transformers import LlamaConfig

from logstream.engine.presets import PRESETS


@pytest.fixture(scope="module")
def roofline() -> ModuleType:
    return load_benchmark("roofline")


def test_highest_takes_each_ceiling_from_its_best_sample(roofline: ModuleType) -> None:
    """A sample slowed by a neighbour must not lower a ceiling that another sample reached:
    each ceiling is the highest over the run, whichever sample it came from."""
    Roofline = roofline.Roofline
    samples = [
        Roofline(fp32_flops=150e9, bf16_flops=60e9, bytes_per_second=24e9, threads=2, load_average=3.0),
        Roofline(fp32_flops=310e9, bf16_flops=55e9, bytes_per_second=20e9, threads=2, load_average=0.4),
        Roofline(fp32_flops=280e9, bf16_flops=58e9, bytes_per_second=25e9, threads=2, load_average=1.0),
    ]
    best = roofline.highest(samples)
    assert (best.fp32_flops, best.bf16_flops, best.bytes_per_second) == (310e9, 60e9, 25e9)
    assert best.load_average == 3.0 and best.threads == 2
    share = best.fraction(155e9, 12.5e9)
    assert share == {"flops_share": 0.5, "bytes_share": 0.5}


def test_measure_samples_this_machine(roofline: ModuleType) -> None:
    roof = roofline.measure(0.03)
    assert roof.fp32_flops > 0 and roof.bf16_flops > 0 and roof.bytes_per_second > 0
    assert roof.threads == torch.get_num_threads()


@pytest.mark.parametrize(
    ("preset", "matmul", "per_key"),
    [("tiny", 212_992, 512), ("small", 1_835_008, 2_048), ("base", 54_525_952, 16_384)],
)
def test_flops_per_token_match_the_documented_table(
    roofline: ModuleType, preset: str, matmul: int, per_key: int
) -> None:
    """docs/benchmarks.md, "FLOPs per token": 213 k / 1.84 M / 54.5 M of matmuls, 512 / 2,048 /
    16,384 per key a query sees."""
    p = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
    )  # fmt: skip
    assert roofline.engine_flops_per_token(config, 0, 0) == matmul
    assert roofline.engine_flops_per_token(config, 95, 2048) == matmul + per_key * (95 + 2048)
