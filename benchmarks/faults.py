"""Faults that the chaos run (benchmarks/chaos.py) and the tests inject into what serve depends on.

- a model directory damaged the ways a store version gets damaged: a copy of a real model
  directory with one fault in its files (config.json, tokenizer.json, the weights);
- the feedback database held by another process (an exclusive lock: a backup, a migration);
- changelog records of the serving model that are forged: token ids past its vocabulary, an
  offset past the end of the stream's partition.

tests/ load this module through tests/benchmarks_support.py (tests/broken_models.py,
tests/feedback_support.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import load_file, save_file

from logstream.kafka_state import StreamState

# -- damaged model directories ---------------------------------------------------------------


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


# -- the feedback database held by another process ---------------------------------------------

# Holds the database until a line arrives on stdin: exclusive locking mode keeps even
# readers out (a WAL database lets readers past a mere BEGIN EXCLUSIVE).
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("SELECT COUNT(*) FROM feedback").fetchone()
print("locked", flush=True)
sys.stdin.readline()
"""


@contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holds the database exclusively for the duration (its `feedback` table
    must exist: serve creates it at start)."""
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        yield
    finally:
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.close()
        locker.wait(timeout=60)


# -- forged changelog records -------------------------------------------------------------------


def forged_states(model_id: str, vocab_size: int, held: list[tuple[str, str]]) -> list[StreamState]:
    """Changelog records of the model `model_id` for two streams that a consumer holds
    (`held`: (stream, "topic/partition")), each one check short of restorable: the first's
    token ids run past the vocabulary (the re-encoding would index past the embedding), the
    second claims offset 2**62 (every later line of its stream would look already scored).
    Send each to changelog partition `input partition mod changelog partitions`, keyed by
    its stream."""
    (first, first_source), (second, second_source) = held
    now = time.time()
    return [
        StreamState(first, model_id, first_source, 1, 1, now, [5, vocab_size + 7]),
        StreamState(second, model_id, second_source, 2**62, 1, now, [5, 6]),
    ]
