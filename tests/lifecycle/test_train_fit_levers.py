"""fit()'s speed levers train the same model: compiled == eager to rounding; bf16 autocast close."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.lifecycle.train import TrainConfig, fit


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _examples() -> list[tuple[list[int], list[int], list[float]]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in (9, 17, 30, 12):  # ragged: batches are padded
        ids = torch.randint(3, 61, (n,), generator=gen).tolist()
        out.append((ids, [i // 5 for i in range(n)], [1.0] * n))
    return out


def _trained(**levers: object) -> tuple[float, dict[str, torch.Tensor]]:
    model = _model()
    config = TrainConfig(batch_size=2, seed=3, max_steps=3)
    fitted = fit(model, _examples(), [1, 2, 3], config, **levers)  # type: ignore[arg-type]
    return fitted.loss, copy.deepcopy(model.state_dict())


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
