"""The streaming engine equals HF's forward inside the window and the slow definition beyond it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engine_support import VOCAB, tiny_llama
from transformers import LlamaForCausalLM

from logstream.engine.kernels.reference import apply_rope, rope_at
from logstream.engine.streaming import StreamingEngine, next_token_nll, rms_norm


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
