"""How the engine cuts a step (logstream/engine/streaming.py): several chunks a step for few
streams, equal blocks of a long chunk, and streams split into steps by their tokens left; none
of it changes the scores."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from engine_support import VOCAB, tiny_llama

from logstream.engine.streaming import StreamingEngine, block_len, step_groups


@pytest.mark.parametrize("int8_ring", [False, True], ids=["fp32", "int8"])
def test_few_streams_take_several_chunks_a_step_with_the_same_scores(int8_ring: bool) -> None:
    """On the CPU a stream takes several chunks in one step when few streams are active
    (`step_chunks`): 4x fewer steps for these streams, and the same token NLLs, next-token
    log-probs and rings (only the last L tokens of a long chunk are written) as one chunk a step.
    An int8 ring keeps one chunk a step (a later block would see unrounded K/V)."""
    model = tiny_llama(2, seed=7)
    gen = torch.Generator().manual_seed(9)
    history = {s: [torch.randint(3, VOCAB, (n,), generator=gen).tolist()] for s, n in [("a", 3), ("b", 9)]}
    batch = {  # ragged: "a" has 61 tokens over 4 lines, "b" 12; rings of 13 wrap many times
        "a": [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (20, 1, 33, 7)],
        "b": [torch.randint(3, VOCAB, (12,), generator=gen).tolist()],
    }
    engines, steps = {}, {}
    for chunks in (1, 8):
        engine = StreamingEngine(
            copy.deepcopy(model), [1, 7, 11], window=13, max_streams=3, chunk_tokens=5, device="cpu",
            int8_ring=int8_ring, step_chunks=chunks,
        )  # fmt: skip
        engine.score(history)
        calls: list[torch.Size] = []

        def step(*args: object, engine: StreamingEngine = engine, calls: list[torch.Size] = calls) -> object:
            calls.append(args[0].shape)  # tokens [B, T]
            return engine.device_step(*args)

        engine.step_fn = step
        engines[chunks], steps[chunks] = (engine, engine.score(batch)), calls
    assert len(steps[1]) == 13  # a: ceil(61 / 5) chunks
    if int8_ring:
        assert steps[8] == steps[1]
    else:  # 4 chunks a step while b has tokens, then 8 alone
        assert len(steps[8]) == 3 and max(shape[1] for shape in steps[8]) == 40 > 13
    (one, want), (many, got) = engines[1], engines[8]
    for s in batch:
        for g, w in zip(got[s], want[s], strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
        m, o = many.streams[s].slot, one.streams[s].slot
        torch.testing.assert_close(many.next_logprobs[m], one.next_logprobs[o], atol=1e-5, rtol=1e-5)
        assert many.position[m] == one.position[o]
    torch.testing.assert_close(many.ring_k, one.ring_k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(many.ring_v, one.ring_v, atol=1e-5, rtol=1e-5)


def test_block_len_cuts_a_stream_s_tokens_into_equal_blocks() -> None:
    """A chunk of T tokens is cut into the fewest blocks of at most chunk_tokens, all of one
    length (the last one padded)."""
    assert [block_len(T, 256) for T in (1, 255, 256, 257, 512, 535, 768, 769)] == [
        1, 255, 256, 129, 256, 179, 256, 193,
    ]  # fmt: skip


def step_cost(groups: list[np.ndarray], chunk_len: np.ndarray, chunk_tokens: int, step_rows: int) -> int:
    """Rows computed by these steps (each stream padded to its step's longest, in equal blocks)."""
    cost = 0
    for group in groups:
        T = int(chunk_len[group].max())
        cost += len(group) * -(-T // block_len(T, chunk_tokens)) * block_len(T, chunk_tokens) + step_rows
    return cost


@pytest.mark.parametrize("seed", range(8))
def test_step_groups_are_the_cheapest_split_of_a_step(seed: int) -> None:
    """Every stream goes in exactly one step, and no split into runs of the sorted streams
    (all 2^(B-1) of them, by brute force) computes fewer rows plus `step_rows` a step."""
    rng = np.random.default_rng(seed)
    chunk_tokens = [256, 7][seed % 2]  # 7: a block's rounding is a large share of its rows
    chunk_len = rng.integers(1, 3 * chunk_tokens + 1, size=8)
    chunk_len[:3] = 3 * chunk_tokens  # a tie, as when long streams take whole chunks
    step_rows = [0, 100, 384, 10**6, 50, 384, 0, 3][seed]
    groups = step_groups(chunk_len, chunk_tokens, step_rows)
    assert sorted(np.concatenate(groups).tolist()) == list(range(8))
    order = np.argsort(chunk_len, kind="stable")
    splits = (np.split(order, [i for i in range(1, 8) if cuts >> (i - 1) & 1]) for cuts in range(2**7))
    best = min(step_cost(split, chunk_len, chunk_tokens, step_rows) for split in splits)
    assert step_cost(groups, chunk_len, chunk_tokens, step_rows) == best
    if step_rows == 10**6:
        assert len(groups) == 1


def test_step_groups_split_off_the_streams_with_few_tokens_left() -> None:
    """The benchmark's step of three streams with 768 tokens and two with 40 and 25: two steps,
    3 x 768 + 2 x 40 rows instead of 5 x 768. Equal chunks stay one step."""
    groups = step_groups(np.array([768, 768, 40, 768, 25]), 256)
    assert [sorted(g.tolist()) for g in groups] == [[0, 1, 3], [2, 4]]
    assert len(step_groups(np.full(20, 256), 256)) == 1


def test_streams_split_into_steps_score_as_in_one_step() -> None:
    """How a round's streams are split into steps (`step_rows`) and the equal blocks of a long
    chunk (`block_len`) change which rows are computed, not the scores: token NLLs, next-token
    log-probs and rings as with every stream in one step."""
    model = tiny_llama(2, seed=11)
    gen = torch.Generator().manual_seed(12)
    lengths = {"a": 23, "b": 2, "c": 17, "d": 3, "e": 11}
    history = {s: [torch.randint(3, VOCAB, (4,), generator=gen).tolist()] for s in lengths}
    batch = {s: [torch.randint(3, VOCAB, (n,), generator=gen).tolist()] for s, n in lengths.items()}
    runs = {}
    for step_rows in (0, 10**9):  # every distinct length a step of its own; never split
        engine = StreamingEngine(
            copy.deepcopy(model), [1, 7, 11], window=13, max_streams=5, chunk_tokens=5, device="cpu",
            step_chunks=20, step_rows=step_rows,
        )  # fmt: skip
        engine.score(history)
        shapes: list[tuple[int, int]] = []

        def step(*args: object, engine: StreamingEngine = engine, shapes: list = shapes) -> object:
            shapes.append(tuple(args[0].shape))  # tokens [B, T]
            return engine.device_step(*args)

        engine.step_fn = step
        runs[step_rows] = engine, engine.score(batch), shapes
    (split, got, split_shapes), (whole, want, whole_shapes) = runs[0], runs[10**9]
    assert whole_shapes == [(5, 20), (1, 3)]  # 4 chunks a stream, then a's last 3 tokens
    # by rows: c's 17 tokens take 4 blocks of 5, as a's 20 do; e's 11 take 3 blocks of 4
    assert sorted(split_shapes) == [(1, 2), (1, 3), (1, 3), (1, 11), (2, 20)]
    for s in batch:
        for g, w in zip(got[s], want[s], strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
        a, b = split.streams[s].slot, whole.streams[s].slot
        torch.testing.assert_close(split.next_logprobs[a], whole.next_logprobs[b], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(split.ring_k[:, a], whole.ring_k[:, b], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(split.ring_v[:, a], whole.ring_v[:, b], atol=1e-5, rtol=1e-5)
