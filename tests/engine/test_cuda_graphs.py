"""`BucketedStep`: each step padded to a bucket shape, the padding invisible in the scores.

The padding runs on any device (`capture=False`); capturing and replaying the padded steps
needs CUDA and is tested in tests/engine/kernels/test_gpu.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from engine_support import VOCAB, tiny_llama

from logstream.engine.cuda_graphs import BucketedStep, bucket
from logstream.engine.streaming import StreamingEngine


def test_bucket_is_the_next_power_of_two() -> None:
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 1000)] == [1, 2, 4, 4, 8, 64, 64, 128, 1024]


def test_capture_needs_a_cuda_engine() -> None:
    engine = StreamingEngine(tiny_llama(2), [1, 7], window=16, max_streams=2, device="cpu")
    with pytest.raises(ValueError, match="CUDA graphs need the engine on a CUDA device"):
        BucketedStep(engine)


@pytest.mark.parametrize("int8_ring", [False, True], ids=["fp32", "int8"])
def test_padded_steps_score_what_unpadded_steps_do(int8_ring: bool) -> None:
    """5 streams of ragged lines (1-23 tokens; 13-slot rings wrap): padded to power-of-two
    streams and tokens, every step gives the same token NLLs, next-token log-probs, heads,
    fills and rings as the unpadded engine."""
    model = tiny_llama(2, seed=3)
    gen = torch.Generator().manual_seed(4)
    lengths = {"a": (23, 1, 9), "b": (5,), "c": (2, 2, 17, 3), "d": (11, 6), "e": (1,)}
    batches = [
        {s: [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths[s]] for s in lengths}
        for _ in range(3)
    ]
    engines, results = [], []
    for padded in (False, True):
        engine = StreamingEngine(
            copy.deepcopy(model), [1, 7, 11], window=13, max_streams=5, chunk_tokens=8, device="cpu",
            int8_ring=int8_ring, step_chunks=1,
        )  # fmt: skip
        shapes: list[tuple[int, int]] = []
        if padded:

            def spy(tokens: torch.Tensor, *args: object, eager=engine.device_step, shapes=shapes) -> object:
                shapes.append(tuple(tokens.shape))
                return eager(tokens, *args)

            engine.device_step = spy  # what BucketedStep calls, padded
            engine.step_fn = BucketedStep(engine, capture=False)
        results.append([engine.score(batch) for batch in batches])
        engines.append(engine)
        if padded:  # 5 streams ran as 8; every step's shape is a power of two in both
            assert (8, 8) in shapes and all(bucket(B) == B and bucket(T) == T for B, T in shapes), shapes
    (plain, want), (bucketed, got) = zip(engines, results, strict=True)
    for w_batch, g_batch in zip(want, got, strict=True):
        for s in lengths:
            for w, g in zip(w_batch[s], g_batch[s], strict=True):
                np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
    for s in lengths:
        p, b = plain.streams[s].slot, bucketed.streams[s].slot
        assert bucketed.position[b] == plain.position[p]
        torch.testing.assert_close(bucketed.next_logprobs[b], plain.next_logprobs[p], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bucketed.ring_k, plain.ring_k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bucketed.ring_v, plain.ring_v, atol=1e-5, rtol=1e-5)
