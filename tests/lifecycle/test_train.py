"""Training pieces: robust down-weighting, held-out split, continued training, early stopping."""

from __future__ import annotations

import torch

from logstream.engine.model import build_model
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.evaluation.synth import generate_lines
from logstream.lifecycle.train import (
    Stream,
    TrainConfig,
    fit,
    lines_before,
    make_examples,
    robust_token_weights,
    split_heldout,
    split_validation,
    train,
    validation_loss,
)
from logstream.scoring.bursts import HORIZON


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


def test_a_short_held_out_tail_counts_its_bursts_after_its_training_lines() -> None:
    """A held-out tail counts its bursts from its own first line, as a scored stream does; one
    shorter than the burst horizon would never have evidence, so it counts after the last
    HORIZON lines its stream wrote in training. Held-out whole streams have none before them."""
    streams = [
        Stream("long", [f"l{i}" for i in range(20 * HORIZON)]),
        Stream("short", [f"s{i}" for i in range(3 * HORIZON)]),
    ]
    train_part, heldout = split_heldout(streams, 0.1)
    before = lines_before(train_part, heldout)
    assert len(heldout[0].lines) >= HORIZON and before[0] == []
    assert len(heldout[1].lines) < HORIZON and before[1] == train_part[1].lines[-HORIZON:]
    many = [Stream(f"host-{k}", [f"h{k}-{i}" for i in range(10)]) for k in range(30)]
    assert lines_before(*split_heldout(many, 0.1)) == [[]] * 3


def test_continued_training_leaves_the_earlier_model_untouched() -> None:
    """Prequential replay keeps one model per chunk: continuing must copy, not mutate."""
    config = TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4)
    first = train([Stream("s", generate_lines(200, seed=1).lines)], config)
    before = {k: v.clone() for k, v in first.model.state_dict().items()}
    second = train([Stream("s", generate_lines(200, seed=2).lines)], config, start_from=first)
    assert second.model is not first.model
    assert all(torch.equal(before[k], v) for k, v in first.model.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in second.model.state_dict().items())


def test_training_stops_when_the_validation_loss_stops_improving() -> None:
    """A small, repetitive baseline is learned long before the step budget: training stops
    once `patience` validation losses in a row did not improve, and keeps the weights of the
    best one (the validation loss of the model it returns is that best loss)."""
    config = TrainConfig(
        preset="tiny", window=64, max_steps=2000, min_steps=20, eval_every=10, patience=2, batch_size=4
    )
    trained = train([Stream("s", generate_lines(400, seed=3).lines)], config)
    meta = trained.meta
    assert meta["train_steps"] < config.max_steps
    assert meta["train_best_step"] <= meta["train_steps"] - config.patience * config.eval_every
    assert meta["validation_loss"] is not None and meta["validation_loss"] < meta["final_loss"] + 1.0
    # every baseline line, held out or not, counted under its template (the rarity's start)
    assert len(meta["template_counts"]) == len(meta["templates"])
    assert sum(meta["template_counts"]) == meta["train_lines"] + meta["heldout_lines"] == 400


def test_validation_windows_are_never_trained_on() -> None:
    """The validation windows are held out of the batches: the same seed picks the same ones,
    and training on the rest leaves their loss above the trained windows' own."""
    lines = [f"job {i % 7} step {i % 5} done" for i in range(300)]
    tokenizer = LineTokenizer(train_tokenizer(lines, 300))
    examples = make_examples([Stream("s", lines)], [tokenizer.encode_lines(lines)], tokenizer.eos_id, 32)
    kept, held = split_validation(examples, seed=0)
    assert held and len(kept) + len(held) == len(examples)
    assert split_validation(examples, seed=0) == (kept, held)
    assert all(h not in kept for h in held)
    few, none = split_validation(examples[:9], seed=0)
    assert none == [] and few == examples[:9]  # too few windows: no early stopping


def test_fit_returns_what_it_kept() -> None:
    """`fit` reports the step it kept and the validation loss of the weights it leaves."""
    lines = [f"GET /api/items/{i % 40} status {200 + i % 3}" for i in range(400)]
    tokenizer = LineTokenizer(train_tokenizer(lines, 300))
    examples = make_examples([Stream("s", lines)], [tokenizer.encode_lines(lines)], tokenizer.eos_id, 48)
    torch.manual_seed(0)
    model = build_model("tiny", tokenizer, max_positions=64)
    config = TrainConfig(max_steps=60, min_steps=10, eval_every=10, patience=2, batch_size=4)
    fitted = fit(model, examples, [tokenizer.bos_id], config)
    _, validation = split_validation(examples, config.seed)
    assert fitted.best_step <= fitted.steps <= config.max_steps
    assert (
        abs(validation_loss(model, validation, [tokenizer.bos_id], config.batch_size) - fitted.validation)
        < 1e-4
    )
