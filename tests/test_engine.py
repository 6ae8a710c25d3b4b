"""The streaming engine equals HF's forward inside the window and the slow definition beyond it."""

from __future__ import annotations

import copy
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.kernels.reference import apply_rope, rope_at
from logstream.engine.streaming import StreamingEngine, block_len, next_token_nll, rms_norm, step_groups

VOCAB = 97


def tiny_llama(kv_heads: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
        attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init is near-uniform; sharpen it so the test has teeth
        for p in model.parameters():
            p.mul_(4.0)
    return model


def hf_token_nll(model: LlamaForCausalLM, sink_ids: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([sink_ids + tokens])
    with torch.no_grad():
        logprobs = F.log_softmax(model(ids).logits[0].float(), dim=-1)  # [S+n, V]
    S = len(sink_ids)
    return -logprobs[S - 1 : S - 1 + len(tokens)].gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_engine_equals_hf_forward_inside_window(kv_heads: int) -> None:
    """Shorter than the window, per-token NLLs and next-token logits match LlamaForCausalLM."""
    model = tiny_llama(kv_heads)
    sink_ids = [1, 5, 9, 13]
    gen = torch.Generator().manual_seed(1)
    streams = {
        f"s{i}": torch.randint(3, VOCAB, (n,), generator=gen).tolist() for i, n in enumerate([37, 5, 60])
    }
    engine = StreamingEngine(model, sink_ids, window=128, max_streams=4, chunk_tokens=16, device="cpu")
    # feed each stream as three lines of uneven length, in two calls, to cross chunk borders
    for half in (slice(0, 20), slice(20, None)):
        batch = {s: [toks[half][:7], toks[half][7:9], toks[half][9:]] for s, toks in streams.items()}
        out = engine.score({s: [ln for ln in lines if ln] for s, lines in batch.items()})
        for s, toks in streams.items():
            got = torch.cat([torch.from_numpy(x) for x in out[s]]) if out[s] else torch.zeros(0)
            start = 0 if half.start == 0 else 20
            want = hf_token_nll(model, sink_ids, toks)[start : start + len(got)]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for s, toks in streams.items():  # the full next-token distribution, i.e. the logits
        ids = torch.tensor([sink_ids + toks])
        with torch.no_grad():
            want = F.log_softmax(model(ids).logits[0, -1].float(), dim=-1)
        torch.testing.assert_close(engine.next_logprobs[engine.streams[s].slot], want, atol=1e-4, rtol=1e-4)


def slow_sink_window_nll(
    model: LlamaForCausalLM, sink_ids: list[int], tokens: list[int], L: int
) -> torch.Tensor:
    """The definition, token by token: sinks at 0..S-1, the last L tokens at S.. by age.

    Keeps every token's pre-RoPE K/V (no ring) and rotates at true cache-relative positions.
    """
    cfg = model.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    S = len(sink_ids)
    cos, sin = rope_at(model.model.rotary_emb.inv_freq, torch.arange(S + L))
    history_k: list[list[torch.Tensor]] = [[] for _ in model.model.layers]  # per layer: [Hkv, D]
    history_v: list[list[torch.Tensor]] = [[] for _ in model.model.layers]
    nll = []
    all_ids = sink_ids + tokens
    for g, token in enumerate(all_ids):
        x = model.model.embed_tokens(torch.tensor([token]))  # [1, C]
        is_sink = g < S
        for i, layer in enumerate(model.model.layers):
            h = rms_norm(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
            q = layer.self_attn.q_proj(h).view(H, D)
            history_k[i].append(layer.self_attn.k_proj(h).view(Hkv, D))
            history_v[i].append(layer.self_attn.v_proj(h).view(Hkv, D))
            if is_sink:
                keys = list(range(g + 1))
                positions = keys
            else:
                first = max(S, g - L + 1)
                keys = list(range(S)) + list(range(first, g + 1))
                positions = list(range(S)) + [S + j for j in range(g + 1 - first)]
            k = torch.stack([history_k[i][j] for j in keys], dim=1)  # [Hkv, K, D]
            v = torch.stack([history_v[i][j] for j in keys], dim=1)
            k = apply_rope(k, cos[positions], sin[positions]).repeat_interleave(H // Hkv, 0)
            v = v.repeat_interleave(H // Hkv, 0)
            qr = apply_rope(q[:, None], cos[positions[-1]], sin[positions[-1]])  # [H, 1, D]
            p = torch.softmax((qr @ k.transpose(1, 2)) * D**-0.5, dim=-1)  # [H, 1, K]
            out = (p @ v).reshape(1, H * D)
            x = x + layer.self_attn.o_proj(out)
            h = rms_norm(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
            x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
        logprobs = F.log_softmax(model.lm_head(rms_norm(x, model.model.norm.weight, cfg.rms_norm_eps)), -1)
        if g + 1 < len(all_ids) and g + 1 >= S:
            nll.append(-logprobs[0, all_ids[g + 1]])
    return torch.stack(nll)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_engine_equals_slow_definition_beyond_window(kv_heads: int) -> None:
    """Past the window the ring wraps (chunks straddle the wrap) and still matches the definition."""
    model = tiny_llama(kv_heads, seed=3)
    sink_ids, L = [1, 7, 11], 13  # L not a power of two; chunk 5 straddles the wrap
    tokens = torch.randint(3, VOCAB, (61,), generator=torch.Generator().manual_seed(2)).tolist()
    engine = StreamingEngine(model, sink_ids, window=L, max_streams=2, chunk_tokens=5, device="cpu")
    lines = [tokens[i : i + 4] for i in range(0, len(tokens), 4)]
    with torch.no_grad():
        want = slow_sink_window_nll(model, sink_ids, tokens, L)
    got = torch.cat([torch.from_numpy(x) for x in engine.score({"s": lines})["s"]])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_rope_at_a_stream_position_of_billions_scores_as_at_zero() -> None:
    """Ring keys are rotated at their stream position, which grows without bound: a query and a
    key 4 positions apart give the same score at 10^12 tokens as at 0 (float64 angles; fp32
    ones are radians off past 10^7)."""
    D = 32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    q, k = torch.randn(2, D, generator=torch.Generator().manual_seed(0))

    def score(start: int) -> float:
        cos, sin = rope_at(inv_freq, torch.tensor([start + 7, start + 3]))  # [2, D]
        return float(apply_rope(q, cos[0], sin[0]) @ apply_rope(k, cos[1], sin[1]))

    at_zero = score(0)
    for start in (10**7, 10**9, 10**12):
        assert abs(score(start) - at_zero) <= 1e-5 * (1 + abs(at_zero)), start


def test_next_token_nll_both_ways_is_cross_entropy() -> None:
    """-log p(next token) by the CPU's fused log-softmax and by the GPU's logsumexp, on the same
    logits: both are the cross-entropy of each position against the token after it."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 2048, generator=generator) * 4  # [B, T, V]
    tokens = torch.randint(0, 2048, (3, 7), generator=generator)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 2048), tokens[:, 1:].reshape(-1), reduction="none")
    want = want.view(3, 6)
    for fused in (True, False):
        torch.testing.assert_close(next_token_nll(logits, tokens, fused=fused), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(next_token_nll(logits, tokens), want, rtol=0, atol=1e-5)  # the CPU's default


# Run in a fresh interpreter: a long-lived one (the test session) may hold a free 16 MiB chunk
# in its heap already, which glibc would hand out whatever the thresholds.
HEAP_CHECK = """
import ctypes, ctypes.util
from logstream.engine import allocator

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2: ten size_t counters
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p

def mapped_while_holding(size):
    block = libc.malloc(size)
    try:
        return libc.mallinfo2().hblks
    finally:
        libc.free(ctypes.c_void_p(block))

idle = libc.mallinfo2().hblks
assert libc.mallopt(allocator.M_MMAP_THRESHOLD, 128 << 10)  # glibc's starting threshold, held
before = mapped_while_holding(16 << 20) - idle
set_ = allocator.keep_step_memory()
after = mapped_while_holding(16 << 20) - idle
print(before, set_, after, libc.mallinfo2().arena >= 16 << 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_cpu_step_sized_blocks_come_from_the_heap_and_stay() -> None:
    """Under glibc's starting mmap threshold a 16 MiB block is mapped afresh; after
    `keep_step_memory` it comes from the heap, and the heap keeps its pages once it is freed
    (allocator.py)."""
    run = subprocess.run([sys.executable, "-c", HEAP_CHECK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "True", "0", "True"]


def test_cache_bytes_constant_while_stream_grows() -> None:
    """Per-stream cache bytes equal layers x 2 x L x Hkv x D x 4 and do not grow with 10x more lines."""
    model = tiny_llama(2)
    engine = StreamingEngine(model, [1, 2], window=32, max_streams=2, chunk_tokens=8, device="cpu")
    line = [5, 6, 7, 8]
    engine.score({"s": [line] * 10})
    before = engine.cache_bytes
    engine.score({"s": [line] * 100})
    assert engine.cache_bytes == before == 2 * 2 * 32 * 2 * 8 * 4


def test_evicted_stream_is_rebuilt_from_recent_tokens() -> None:
    """A stream evicted by LRU and rebuilt (its history fits the window) scores as if it never left."""
    model = tiny_llama(2)
    lines = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    roomy = StreamingEngine(model, [1], window=32, max_streams=4, chunk_tokens=8, device="cpu")
    tight = StreamingEngine(model, [1], window=32, max_streams=1, chunk_tokens=8, device="cpu")
    for engine in (roomy, tight):
        engine.score({"a": lines})
        engine.score({"b": lines})  # evicts "a" in the tight engine
    want = roomy.score({"a": lines})["a"]
    got = tight.score({"a": lines})["a"]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(w), atol=1e-4, rtol=1e-4)


def _wrapped_engine(
    dtype: torch.dtype = torch.float32, model: LlamaForCausalLM | None = None
) -> StreamingEngine:
    """Three streams of uneven history over a ring of 13 (two have wrapped)."""
    model = model or tiny_llama(2, seed=4)
    engine = StreamingEngine(
        model, [1, 7, 11], window=13, max_streams=4, chunk_tokens=5, device="cpu", dtype=dtype
    )
    gen = torch.Generator().manual_seed(6)
    engine.score(
        {f"s{i}": [torch.randint(3, VOCAB, (n,), generator=gen).tolist()] for i, n in enumerate([30, 4, 17])}
    )
    return engine


def test_device_step_is_score_without_the_bookkeeping() -> None:
    """device_step on the streams' cache positions gives engine.score's NLLs and next log-probs."""
    engine, twin = _wrapped_engine(), _wrapped_engine()
    names = ["s0", "s1", "s2"]
    chunks = [[5, 6, 7, 8], [9], [10, 11, 12]]
    slots = [engine.streams[s].slot for s in names]
    tokens = torch.tensor([c + [0] * (4 - len(c)) for c in chunks])  # [B, T] padded
    cache = torch.tensor([slots, engine.position[slots].tolist(), [len(c) for c in chunks]])  # [3, B]
    previous = engine.next_logprobs[slots]  # [B, V]
    nll, last = engine.device_step(tokens, previous, *cache, ring_len=engine.window - 1)
    want = twin.score({s: [c] for s, c in zip(names, chunks, strict=True)})
    for b, s in enumerate(names):
        torch.testing.assert_close(
            nll[b, : len(chunks[b])], torch.from_numpy(want[s][0]), atol=1e-5, rtol=1e-5
        )
        assert torch.all(nll[b, len(chunks[b]) :] == 0)
        torch.testing.assert_close(last[b], twin.next_logprobs[twin.streams[s].slot], atol=1e-5, rtol=1e-5)


def test_compiled_device_step_equals_eager() -> None:
    """torch.compile of the pure device step scores exactly as the eager step (same shapes)."""
    engine, twin = _wrapped_engine(), _wrapped_engine()
    twin.step_fn = torch.compile(twin.device_step, dynamic=False)
    batch = {"s0": [[5, 6, 7, 8, 9]], "s1": [[10, 11]], "s2": [[12, 13, 14]]}
    want, got = engine.score(batch), twin.score(batch)
    for s in batch:
        torch.testing.assert_close(got[s][0], want[s][0], atol=1e-6, rtol=1e-6)


def test_bf16_engine_within_stated_tolerance() -> None:
    """bf16 weights and cache (opt-in): token NLLs within 0.05 nats + 5% of the fp32 engine's."""
    model = tiny_llama(2, seed=4)
    fp32 = _wrapped_engine(model=copy.deepcopy(model))
    bf16 = _wrapped_engine(torch.bfloat16, model=copy.deepcopy(model))
    batch = {"s0": [[5, 6, 7, 8, 9]], "s1": [[10, 11]], "s2": [[12, 13, 14]]}
    want, got = fp32.score(batch), bf16.score(batch)
    for s in batch:
        torch.testing.assert_close(
            torch.from_numpy(got[s][0]), torch.from_numpy(want[s][0]), atol=0.05, rtol=0.05
        )


def test_offloaded_ring_pages_back_exactly_after_wrap() -> None:
    """offload=True: a stream evicted after its ring wrapped gets its ring back from host memory
    and scores exactly as if it never left (a rebuild from its last L tokens cannot: their keys
    were computed with an older context)."""
    model = tiny_llama(2, seed=5)
    gen = torch.Generator().manual_seed(8)
    history = [torch.randint(3, VOCAB, (6,), generator=gen).tolist() for _ in range(8)]  # 48 tokens > L
    probe = [[20, 21, 22, 23], [24, 25]]
    roomy = StreamingEngine(model, [1, 2], window=16, max_streams=2, chunk_tokens=8, device="cpu")
    offload = StreamingEngine(
        model, [1, 2], window=16, max_streams=1, chunk_tokens=8, device="cpu", offload=True
    )
    rebuild = StreamingEngine(model, [1, 2], window=16, max_streams=1, chunk_tokens=8, device="cpu")
    for engine in (roomy, offload, rebuild):
        engine.score({"a": history})
        engine.score({"b": history[:2]})  # evicts "a" from the one-slot engines
    assert offload.offloaded_bytes == offload.bytes_per_stream and not offload.evicted
    want = roomy.score({"a": probe})["a"]
    got = offload.score({"a": probe})["a"]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert "a" in offload.streams and "b" in offload.offloaded
    rebuilt = rebuild.score({"a": probe})["a"]
    assert not all(np.allclose(g, w, atol=1e-6) for g, w in zip(rebuilt, want, strict=True))


def test_int8_ring_within_stated_tolerance_and_offloads_exactly() -> None:
    """int8 ring (per token and kv head scales, opt-in): token NLLs within 0.02 nats + 2% of the
    fp32 ring's after wrap-around, at a quarter of the ring bytes (plus one fp32 scale per D);
    offloaded and paged back with its scales, it scores exactly as if it never left."""
    model = tiny_llama(2, seed=4)
    fp32 = _wrapped_engine(model=copy.deepcopy(model))
    int8 = StreamingEngine(
        model, [1, 7, 11], window=13, max_streams=4, chunk_tokens=5, device="cpu", int8_ring=True
    )
    gen = torch.Generator().manual_seed(6)
    int8.score(
        {f"s{i}": [torch.randint(3, VOCAB, (n,), generator=gen).tolist()] for i, n in enumerate([30, 4, 17])}
    )
    assert int8.bytes_per_stream == fp32.bytes_per_stream // 4 + 2 * 2 * 13 * 2 * 4  # D = 8: scales add 1/8
    batch = {"s0": [[5, 6, 7, 8, 9]], "s1": [[10, 11]], "s2": [[12, 13, 14]]}
    want, got = fp32.score(batch), int8.score(batch)
    for s in batch:
        torch.testing.assert_close(
            torch.from_numpy(got[s][0]), torch.from_numpy(want[s][0]), atol=0.02, rtol=0.02
        )
    tight = StreamingEngine(
        model,
        [1, 7, 11],
        window=13,
        max_streams=1,
        chunk_tokens=5,
        device="cpu",
        int8_ring=True,
        offload=True,
    )
    roomy = StreamingEngine(
        model, [1, 7, 11], window=13, max_streams=2, chunk_tokens=5, device="cpu", int8_ring=True
    )
    for engine in (tight, roomy):
        engine.score({"a": [list(range(3, 33))]})
        engine.score({"b": [[4, 5, 6]]})
    probe = {"a": [[7, 8, 9]]}
    got, want = tight.score(probe)["a"], roomy.score(probe)["a"]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


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
