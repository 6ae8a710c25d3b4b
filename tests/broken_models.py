"""Model directories damaged the ways a store version gets damaged: a copy of a real model
directory with one fault in its files (config.json, tokenizer.json, the weights)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file, save_file


def _config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _double_hidden_size(directory: Path) -> None:
    _config(directory, hidden_size=2 * json.loads((directory / "config.json").read_text())["hidden_size"])


def _one_layer_more(directory: Path) -> None:
    """A config.json that asks for a layer the weights do not hold (transformers would fill it
    with random numbers and load without a word)."""
    _config(
        directory,
        num_hidden_layers=json.loads((directory / "config.json").read_text())["num_hidden_layers"] + 1,
    )


def _halve(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _nan_weights(directory: Path) -> None:
    """Weights of the right names and shapes whose final norm is NaN: every score is NaN."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    tensors["model.norm.weight"].fill_(float("nan"))
    save_file(tensors, path, metadata={"format": "pt"})


# name -> what it does to a model directory
BREAKAGES: dict[str, Callable[[Path], None]] = {
    "hidden_size_doubled": _double_hidden_size,
    "zero_heads": lambda d: _config(d, num_attention_heads=0),
    "one_layer_more": _one_layer_more,
    "tokenizer_corrupt": lambda d: _halve(d / "tokenizer.json"),
    "weights_truncated": lambda d: _halve(d / "model.safetensors"),
    "weights_nan": _nan_weights,
}


def broken_copy(model_dir: Path, destination: Path, breakage: str) -> Path:
    """A copy of `model_dir` at `destination` with one of BREAKAGES done to it."""
    shutil.copytree(model_dir, destination)
    BREAKAGES[breakage](destination)
    return destination
