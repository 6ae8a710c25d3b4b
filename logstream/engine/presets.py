"""Model size presets: a table looked up by name (`tiny` for tests, `small` on a CPU, `base` on a GPU).

Its own module, free of torch, so that the model directory's schema (`metadata`) can check a
preset name without importing the model code (which imports `metadata` to validate).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int


PRESETS: dict[str, Preset] = {
    "tiny": Preset(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128, vocab_size=512),
    "small": Preset(hidden_size=128, layers=4, heads=4, kv_heads=2, intermediate_size=384, vocab_size=1024),
    "base": Preset(hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536, vocab_size=4096),
}  # fmt: skip
