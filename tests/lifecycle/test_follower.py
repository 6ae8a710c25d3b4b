"""Hot reload (logstream.lifecycle.follower): a follower switches to the store's new live version at its
next poll, and streams keep their context across the switch when the tokenizer is shared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from alerts_support import FakeClock

from logstream.detector import Detector
from logstream.evaluation.synth import generate_lines
from logstream.lifecycle import model_store
from logstream.lifecycle.follower import ModelFollower, carry_streams
from logstream.records import LogRecord


@pytest.fixture(scope="module")
def store(synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with two versions of the synthetic model (the same tokenizer and weights)."""
    root = tmp_path_factory.mktemp("live-model") / "store"
    for _ in range(2):
        model_store.add(root, synthetic_model_dir)
    model_store.promote(root, "v0001")
    return root


def test_follower_switches_at_its_next_poll_and_back_on_rollback(store: Path) -> None:
    """No switch before reload_seconds; after a promote the next poll loads v0002 (its model id
    names it), after a rollback v0001; with nothing changed, no reload."""
    clock = FakeClock()
    follower = ModelFollower(store, {"device": "cpu"}, reload_seconds=5, clock=clock)
    live = follower.load_live()
    assert live.model_id.startswith("v0001@")
    model_store.promote(store, "v0002")
    assert follower.poll(live) is None  # not yet due
    clock.advance(5)
    promoted = follower.poll(live)
    assert promoted is not None and promoted.model_id.startswith("v0002@")
    clock.advance(5)
    assert follower.poll(promoted) is None
    model_store.rollback(store)
    clock.advance(5)
    back = follower.poll(promoted)
    assert back is not None and back.model_id.startswith("v0001@")


def test_carried_streams_score_the_next_line_as_before(store: Path) -> None:
    """A stream's recent tokens handed to the new version are replayed on its next line: that
    line scores as it would have without the switch (same weights, same context)."""
    lines = [line for line in generate_lines(200, seed=3).lines if " worker-0 " in line][:8]
    old = Detector.load(model_store.version_dir(store, "v0001"), device="cpu")
    new = Detector.load(model_store.version_dir(store, "v0002"), device="cpu")
    cold = Detector.load(model_store.version_dir(store, "v0002"), device="cpu")
    old.token_surprisal([LogRecord(line=line, stream="a") for line in lines[:-1]])
    assert carry_streams(old, new) == 1
    last = [LogRecord(line=lines[-1], stream="a")]
    _, _, expected = old.token_surprisal(last)
    _, _, carried = new.token_surprisal(last)
    _, _, fresh = cold.token_surprisal(last)
    # equal up to float summation order (the replay runs the context as one chunk)
    np.testing.assert_allclose(carried[0], expected[0], atol=1e-2)
    assert np.abs(fresh[0] - expected[0]).max() > 1.0  # without the context it differs
