"""Training pieces: robust down-weighting, held-out split, continued training."""

from __future__ import annotations

import torch

from logstream.normalize import Normalizer
from logstream.synth import generate_lines
from logstream.train import (
    Stream,
    TrainConfig,
    mask_streams,
    rare_event_weights,
    robust_token_weights,
    split_heldout,
    train,
)


def test_robust_weights_cap_only_the_highest_loss_lines() -> None:
    """The top share of lines by mean loss get weight tau/loss < 1; the rest keep weight 1."""
    token_loss = torch.tensor([[1.0, 1.0, 9.0, 9.0], [1.2, 1.2, 0.8, 0.0]])
    line_ids = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    weights = robust_token_weights(token_loss, line_ids, mask, share=0.25)
    assert weights[0, 2] == weights[0, 3] and 0 < weights[0, 2] < 1  # the 9.0-loss line
    assert torch.all(weights[0, :2] == 1) and torch.all(weights[1, :3] == 1)
    assert weights[1, 3] == 0  # padding never counts


def test_few_streams_hold_out_each_tail() -> None:
    """With few streams, calibration holds out each stream's last lines, never mixing them into training."""
    streams = [Stream("a", [f"a{i}" for i in range(50)]), Stream("b", [f"b{i}" for i in range(20)])]
    train_part, heldout = split_heldout(streams, 0.1)
    assert [s.lines[-1] for s in train_part] == ["a44", "b17"]
    assert [s.lines for s in heldout] == [[f"a{i}" for i in range(45, 50)], ["b18", "b19"]]


def test_continued_training_leaves_the_earlier_model_untouched() -> None:
    """Prequential replay keeps one model per chunk: continuing must copy, not mutate."""
    config = TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4)
    first = train([Stream("s", generate_lines(200, seed=1).lines)], config)
    before = {k: v.clone() for k, v in first.model.state_dict().items()}
    second = train([Stream("s", generate_lines(200, seed=2).lines)], config, start_from=first)
    assert second.model is not first.model
    assert all(torch.equal(before[k], v) for k, v in first.model.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in second.model.state_dict().items())


def test_a_one_off_line_weighs_one_reading_of_it() -> None:
    """`rare_event_weights`: a line whose template has n < epochs lines weighs n / epochs, so
    over the run it counts n times, a one-off line once; a template seen at least once per
    epoch weighs 1."""
    routine = [f"GET /api/items/{i} status 200" for i in range(30)]
    streams = [
        Stream("web", [*routine[:15], "kernel: Out of memory: Kill process 812 (java)", *routine[15:]]),
        Stream("db", ["checkpoint complete", "checkpoint complete"]),
    ]
    web, db = rare_event_weights(mask_streams(streams, Normalizer()), epochs=10.0)
    assert web[15] == 0.1 and web[:15] == web[16:] == [1.0] * 15
    assert db == [0.2, 0.2]
