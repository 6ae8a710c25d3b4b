"""fit()'s speed levers train the same model: compiled == eager to rounding; bf16 autocast close."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.train import TrainConfig, fit, rename_repeats


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _examples() -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in (9, 17, 30, 12):  # ragged: batches are padded
        ids = torch.randint(3, 61, (n,), generator=gen).tolist()
        out.append((ids, [i // 5 for i in range(n)]))
    return out


def _trained(**levers: object) -> tuple[float, dict[str, torch.Tensor]]:
    model = _model()
    config = TrainConfig(batch_size=2, seed=3)
    loss = fit(model, _examples(), [1, 2, 3], config, steps=3, **levers)  # type: ignore[arg-type]
    return loss, copy.deepcopy(model.state_dict())


@pytest.mark.slow  # compiling forward + backward: about 1-2 minutes on the loaded 2-core machine
def test_compiled_fit_trains_the_eager_model() -> None:
    """Three steps with torch.compile end at the eager run's loss and weights (1e-5)."""
    loss, weights = _trained()
    got_loss, got_weights = _trained(compile=True)
    assert abs(got_loss - loss) < 1e-5
    for name, w in weights.items():
        torch.testing.assert_close(got_weights[name], w, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_fit_stays_close() -> None:
    """bf16 autocast (matmuls in bf16, fp32 weights): the loss within 2% of the fp32 run's."""
    loss, _ = _trained()
    got_loss, _ = _trained(autocast=torch.bfloat16)
    assert abs(got_loss - loss) <= 0.02 * loss


def test_rename_repeats_renames_each_recurring_token_consistently() -> None:
    """Tokens seen in 2+ lines get one new id each (about half of them); a token of one line
    only, the specials (< 4) and line ends stay."""
    line = [1, 10, 11, 12, 13, 14, 15, 16, 17, 5]  # 1: a special; 5: the line end
    ids = line * 3 + [20, 21, 5]  # 20, 21: in one line only
    line_of = [i // len(line) for i in range(3 * len(line))] + [3, 3, 3]
    renamed = rename_repeats(ids, line_of, vocab_size=1000, rng=random.Random(0))
    assert len(renamed) == len(ids) and renamed[-3:] == [20, 21, 5]
    mapping = {a: b for a, b in zip(ids, renamed, strict=True) if a != b}
    assert 1 not in mapping and 5 not in mapping
    assert 0 < len(mapping) < 8  # about half of the 8 recurring tokens (seeded)
    assert all(b == mapping.get(a, a) for a, b in zip(ids, renamed, strict=True))  # one new id per token
    assert min(mapping.values()) >= 4  # never a special


def test_copy_share_teaches_the_model_to_copy_from_its_context() -> None:
    """On a baseline of one line repeated (memorisable: nothing to copy), a token the weights
    never saw in that slot is as surprising on its sixth line as on its first. With renamed
    windows in training, it is predicted from the lines before it."""
    line = [10, 11, 12, 13, 5]
    examples = [(line * 6, [i // len(line) for i in range(6 * len(line))]) for _ in range(16)]
    probe = torch.tensor([[1, *([10, 40, 12, 13, 5] * 6)]])  # 40 in slot 2: never in the baseline
    slots = [1 + k * len(line) + 1 for k in range(1, 6)]  # token 40 on lines 2-6

    def surprise(copy_share: float) -> float:
        model = _model()
        fit(model, examples, [1], TrainConfig(batch_size=4, seed=3, copy_share=copy_share), steps=150)
        with torch.no_grad():
            logp = torch.log_softmax(model(probe).logits[0], dim=-1)
        return float(torch.stack([-logp[s - 1, 40] for s in slots]).mean())

    assert surprise(0.5) < 1.0 < 4.0 < surprise(0.0)
