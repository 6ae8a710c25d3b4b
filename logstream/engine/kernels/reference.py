"""Torch reference for the sink + ring cache: the definition of correct.

Every kernel in this package is tested against these functions. They are
written for clarity first; the engine uses them on CPU.

Layouts (one layer; every key is stored *rotated*, RoPE applied once, when it is made):
    ring_k, ring_v: [N, Hkv, L, D]   N stream slots in the pool, L ring slots
    sink_k, sink_v: [Hkv, S, D]      the pattern prompt's K/V (S >= 1)
    q_win, q_sink:  [B, H, T, D]     a chunk of T queries per stream (padded), rotated twice
    k_new, v_new:   [B, Hkv, T, D]   the chunk's own keys/values
    slots:          [B] int64        which pool slot each stream owns
    head:           [B] int64        next ring slot to write
    fill:           [B] int64        valid ring entries (<= L)
    chunk_len:      [B] int64        real tokens in the chunk (<= T, <= L)

Positions (StreamingLLM, cache-relative). Query t of a stream sees the sinks
plus its last W_t tokens, itself included: W_t = min(fill + t + 1, L). Sinks
sit at 0..S-1, the window at S..S+W_t-1 by age, the query last at S+W_t-1.
So no position is ever >= S + L, the range the model was trained on.

RoPE only sees position *differences*, so window keys and queries may be rotated
at any common offset: at the stream's own token count (its position p, the
tokens it has written), so ring key of age r at p - r, chunk key j at p + j,
query t at p + t (`q_win`). Then a key is rotated once, when it is written, and
never again however often it is read. Sinks sit at 0..S-1 whatever the stream's
position, so q is rotated a second time at its true position S + W_t - 1 for them
(`q_sink`). `rope_at` takes angles in float64, so that a position of billions
rotates as exactly as 0.
"""

from __future__ import annotations

import math

import torch


def rope_at(
    inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., D] fp32 at integer positions [...], in the HF Llama layout (frequencies
    repeated twice). The angles are taken in float64 and reduced mod 2 pi before fp32's cos
    and sin: in fp32 a position near 10^7 would be a radian off, in float64 one near 10^15."""
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)  # [..., D/2]
    angles = torch.remainder(angles, 2 * math.pi).float()
    angles = torch.cat([angles, angles], dim=-1)  # [..., D]
    return angles.cos() * scaling, angles.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin; cos/sin broadcast against x [..., D].

    `addcmul` adds the second product as it makes it: one pass and one temporary fewer, 1-4% of a
    CPU step (docs/benchmarks.md)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return torch.addcmul(x.float() * cos, rotated.float(), sin).to(x.dtype)


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
    q_win: torch.Tensor,
    q_sink: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    sink_k: torch.Tensor,
    sink_v: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    fill: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over sinks + ring + itself, every key and query rotated.

    Returns (out [B, H, T, D] in q's dtype, logsumexp [B, H, T] in fp32).
    Padding queries (t >= chunk_len) produce values that callers ignore.
    """
    _, H, T, D = q_win.shape
    Hkv, S = sink_k.shape[0], sink_k.shape[1]
    L = ring_k.shape[2]
    G = H // Hkv  # query heads per kv head (GQA)
    scale = D**-0.5
    t = torch.arange(T, device=q_win.device)
    age = ring_age(head, L)  # [B, L]

    def expand(x: torch.Tensor) -> torch.Tensor:  # [.., Hkv, N, D] -> [.., H, N, D]
        return x.repeat_interleave(G, dim=-3).float()

    s_sink = torch.einsum("bhtd,hsd->bhts", q_sink.float(), expand(sink_k))  # [B, H, T, S]
    s_ring = torch.einsum("bhtd,bhld->bhtl", q_win.float(), expand(ring_k[slots]))  # [B, H, T, L]
    s_chunk = torch.einsum("bhtd,bhjd->bhtj", q_win.float(), expand(k_new))  # [B, H, T, T]

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
    out = (
        torch.einsum("bhts,hsd->bhtd", p[..., :S], expand(sink_v))
        + torch.einsum("bhtl,bhld->bhtd", p[..., S : S + L], expand(ring_v[slots]))
        + torch.einsum("bhtj,bhjd->bhtd", p[..., S + L :], expand(v_new))
    )
    return out.to(q_win.dtype), lse
