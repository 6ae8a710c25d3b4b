"""Torch reference for the sink + ring cache: the definition of correct.

Every kernel in this package is tested against these functions. They are
written for clarity first; the engine uses them on CPU.

Layouts (one layer; keys are always stored *before* RoPE):
    ring_k, ring_v: [N, Hkv, L, D]   N stream slots in the pool, L ring slots
    sink_k, sink_v: [Hkv, S, D]      the pattern prompt's K/V (S >= 1)
    q:              [B, H, T, D]     a chunk of T queries per stream (padded)
    k_new, v_new:   [B, Hkv, T, D]   the chunk's own keys/values
    slots:          [B] int64        which pool slot each stream owns
    head:           [B] int64        next ring slot to write
    fill:           [B] int64        valid ring entries (<= L)
    chunk_len:      [B] int64        real tokens in the chunk (<= T, <= L)
    cos, sin:       [P, D]           RoPE tables, P >= S + 2 * L

Positions (StreamingLLM, cache-relative). Query t of a stream sees the sinks
plus its last W_t tokens, itself included: W_t = min(fill + t + 1, L). Sinks
sit at 0..S-1, the window at S..S+W_t-1 by age, the query last at S+W_t-1.
So no position is ever >= S + L, the range the model was trained on.

RoPE only sees position *differences*, so for window keys we may rotate q and
k at any common offset: we use the chunk-relative index + L (ring key of age r
at L - r, chunk key j at L + j, query t at L + t). That lets every key be
rotated once per step instead of once per query. Sinks are not relative to the
window, so q is rotated a second time at its true position S + W_t - 1 for them.
"""

from __future__ import annotations

import torch


def rope_tables(
    inv_freq: torch.Tensor, n_positions: int, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [P, D] in the HF Llama layout (frequencies repeated twice)."""
    pos = torch.arange(n_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(pos, inv_freq.float())  # [P, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [P, D]
    return emb.cos() * scaling, emb.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin; cos/sin broadcast against x [..., D]."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (int8 [..., D], fp32 scale [..., 1]) with x ~ int8 x scale, scale = max|x| / 127."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127.0
    return torch.round(x.float() / scale).to(torch.int8), scale


def dequantize_int8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values an int8 ring holds: x [..., D] int8 times scale [..., 1] fp32, in `dtype`."""
    return (x * scale).to(dtype)


def ring_age(head: torch.Tensor, L: int) -> torch.Tensor:
    """Age of each ring slot at the start of a chunk: [B, L], 1 = newest."""
    slot = torch.arange(L, device=head.device)
    return (head[:, None] - 1 - slot[None, :]) % L + 1


def ring_write(
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    chunk_len: torch.Tensor,
) -> None:
    """Scatter the chunk's K/V into slots (head + i) mod L of each stream's ring, in place."""
    B, _, T, _ = k_new.shape
    L = ring_k.shape[2]
    assert int(chunk_len.max()) <= L, "a chunk longer than the ring would overwrite itself"
    t = torch.arange(T, device=k_new.device)
    valid = t[None, :] < chunk_len[:, None]  # [B, T]
    pool_idx = slots[:, None].expand(B, T)[valid]  # [n]
    ring_idx = ((head[:, None] + t[None, :]) % L)[valid]  # [n]
    ring_k[pool_idx, :, ring_idx] = k_new.transpose(1, 2)[valid]  # [n, Hkv, D]
    ring_v[pool_idx, :, ring_idx] = v_new.transpose(1, 2)[valid]


def sink_ring_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    sink_k: torch.Tensor,
    sink_v: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    fill: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over sinks + ring + itself.

    Returns (out [B, H, T, D] in q's dtype, logsumexp [B, H, T] in fp32).
    Padding queries (t >= chunk_len) produce values that callers ignore.
    """
    _, H, T, D = q.shape
    Hkv, S = sink_k.shape[0], sink_k.shape[1]
    L = ring_k.shape[2]
    G = H // Hkv  # query heads per kv head (GQA)
    scale = D**-0.5
    t = torch.arange(T, device=q.device)

    # Sinks: q at its true position S + W_t - 1, sink keys at 0..S-1.
    W = torch.clamp(fill[:, None] + t[None, :] + 1, max=L)  # [B, T]
    pos_q = S + W - 1  # [B, T]
    q_sink = apply_rope(q, cos[pos_q][:, None], sin[pos_q][:, None])  # [B, H, T, D]
    k_sink = apply_rope(sink_k, cos[:S], sin[:S])  # [Hkv, S, D]

    # Window: relative offsets, ring key of age r at L - r, chunk key j at L + j.
    age = ring_age(head, L)  # [B, L]
    q_win = apply_rope(q, cos[L + t], sin[L + t])  # [B, H, T, D]
    ring_kb = ring_k[slots]  # [B, Hkv, L, D]
    k_ring = apply_rope(ring_kb, cos[L - age][:, None], sin[L - age][:, None])
    k_chunk = apply_rope(k_new, cos[L + t], sin[L + t])  # [B, Hkv, T, D]

    def expand(x: torch.Tensor) -> torch.Tensor:  # [.., Hkv, N, D] -> [.., H, N, D]
        return x.repeat_interleave(G, dim=-3).float()

    s_sink = torch.einsum("bhtd,hsd->bhts", q_sink.float(), expand(k_sink))  # [B, H, T, S]
    s_ring = torch.einsum("bhtd,bhld->bhtl", q_win.float(), expand(k_ring))  # [B, H, T, L]
    s_chunk = torch.einsum("bhtd,bhjd->bhtj", q_win.float(), expand(k_chunk))  # [B, H, T, T]

    # Query t sees a ring entry of age r if it is filled and t + r <= L - 1.
    ring_visible = (age[:, None, :] <= fill[:, None, None]) & (
        t[None, :, None] + age[:, None, :] <= L - 1
    )  # [B, T, L]
    causal = t[None, :] <= t[:, None]  # [T, T]
    s_ring = s_ring.masked_fill(~ring_visible[:, None], float("-inf"))
    s_chunk = s_chunk.masked_fill(~causal, float("-inf"))

    scores = torch.cat([s_sink, s_ring, s_chunk], dim=-1) * scale  # [B, H, T, S+L+T]
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, T]
    p = torch.exp(scores - lse[..., None])
    v_ring_b = ring_v[slots]  # [B, Hkv, L, D]
    out = (
        torch.einsum("bhts,hsd->bhtd", p[..., :S], expand(sink_v))
        + torch.einsum("bhtl,bhld->bhtd", p[..., S : S + L], expand(v_ring_b))
        + torch.einsum("bhtj,bhjd->bhtd", p[..., S + L :], expand(v_new))
    )
    return out.to(q.dtype), lse
