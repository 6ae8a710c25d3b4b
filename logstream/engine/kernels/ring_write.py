"""Triton ring write: scatter a chunk's K/V into each stream's ring, in place.

Same contract as `reference.ring_write` (layouts in reference.py): token i of
stream b goes to ring slot (head[b] + i) mod L of pool slot slots[b], for
i < chunk_len[b]. Keys are stored before RoPE, as they come; into an int8 ring
(`scales` given) each token's K and V per kv head are quantized as
`reference.quantize_int8` does, x ~ int8 x scale with scale = max|x| / 127. The kernel
allocates nothing and never syncs with the host, so it can sit inside a
captured CUDA graph.

One program copies BLOCK_T tokens x D of one (stream, kv head) for both K and
V. A chunk is a few KiB per stream and layer, so this is launch-bound; a
variant over all layers at once would save (layers - 1) launches per step
only if the engine kept every layer's new K/V alive until the end of the
step, which costs more than the launches inside a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _quantize_int8(x):
    """x [T, D] -> (round(x / scale) int8 [T, D], scale [T] fp32), scale = max|x| / 127 per row.
    Division rounded to nearest and rounding half to even, as torch does (`reference.quantize_int8`)."""
    x = x.to(tl.float32)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), 1), 1e-8), 127.0)  # [T]
    y = tl.math.div_rn(x, scale[:, None])
    r = tl.floor(y + 0.5)
    r = tl.where(r - y == 0.5, 2.0 * tl.floor(r * 0.5), r)  # a tie goes to the even neighbour
    return r.to(tl.int8), scale


@triton.jit
def _ring_write_kernel(
    RING_K, RING_V, K_NEW, V_NEW, K_SCALE, V_SCALE, SLOTS, HEAD, CHUNK_LEN,
    s_rn, s_rh, s_rl, s_rd,  # ring_k/ring_v strides [N, Hkv, L, D]
    s_nb, s_nh, s_nt, s_nd,  # k_new/v_new strides [B, Hkv, T, D]
    s_cn, s_ch, s_cl,  # int8 ring's scales [N, Hkv, L, 1]
    T, L,
    D: tl.constexpr, BLOCK_T: tl.constexpr, QUANTIZE: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    d = tl.arange(0, D)  # [D]
    slot = tl.load(SLOTS + b)
    head = tl.load(HEAD + b)
    n = tl.load(CHUNK_LEN + b)
    tl.device_assert(n <= L, "a chunk longer than the ring would overwrite itself")
    keep = (t < n) & (t < T)  # [BLOCK_T]
    ring_pos = (head + t) % L  # [BLOCK_T]
    src = b * s_nb + h * s_nh + t[:, None] * s_nt + d[None, :] * s_nd  # [BLOCK_T, D]
    dst = slot * s_rn + h * s_rh + ring_pos[:, None] * s_rl + d[None, :] * s_rd
    mask = keep[:, None]
    k = tl.load(K_NEW + src, mask=mask, other=0.0)
    v = tl.load(V_NEW + src, mask=mask, other=0.0)
    if QUANTIZE:
        k, k_scale = _quantize_int8(k)
        v, v_scale = _quantize_int8(v)
        at = slot * s_cn + h * s_ch + ring_pos * s_cl  # [BLOCK_T]
        tl.store(K_SCALE + at, k_scale, mask=keep)
        tl.store(V_SCALE + at, v_scale, mask=keep)
    tl.store(RING_K + dst, k, mask=mask)
    tl.store(RING_V + dst, v, mask=mask)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One shape and one set of strides, but for dims of size 1: no index multiplies their
    strides, and torch sets them freely (the engine's rotated k_new at T = 1 differs from v_new)."""
    strides = zip(a.stride(), b.stride(), a.shape, strict=True)
    return a.shape == b.shape and all(x == y for x, y, n in strides if n > 1)


def scale_args(
    ring_k: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """(k_scale, v_scale, their strides [N, Hkv, L]) as a kernel launch takes an int8 ring's scales;
    without an int8 ring, ring_k stands in (a launch needs real pointers; none is touched)."""
    if scales is None:
        return ring_k, ring_k, (0, 0, 0)
    k_scale, v_scale = scales
    assert k_scale.shape == v_scale.shape == (*ring_k.shape[:3], 1), "ring scales must be [N, Hkv, L, 1]"
    assert k_scale.dtype == v_scale.dtype == torch.float32, "ring scales: fp32"
    assert same_layout(k_scale, v_scale), "k and v scales must share a layout"
    return k_scale, v_scale, k_scale.stride()[:3]


def ring_write(
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    chunk_len: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Scatter the chunk's K/V into slots (head + i) mod L of each stream's ring, in place.

    ring_k, ring_v [N, Hkv, L, D]; k_new, v_new [B, Hkv, T, D] (any strides);
    slots, head, chunk_len [B] int64. chunk_len <= L is the caller's promise:
    checking it would sync with the host, so only debug builds assert it.
    `scales` (k, v) [N, Hkv, L, 1] fp32: the ring is int8; each token is quantized
    and its scales written beside it.
    """
    B, Hkv, T, D = k_new.shape
    N, _, L, _ = ring_k.shape
    assert ring_k.shape == (N, Hkv, L, D), "ring_k/ring_v must be [N, Hkv, L, D]"
    assert same_layout(ring_k, ring_v), "ring_k and ring_v must share a layout"
    assert same_layout(k_new, v_new), "k_new/v_new differ"
    assert ring_k.dtype == ring_v.dtype == (k_new.dtype if scales is None else torch.int8), "ring dtype"
    assert k_new.dtype == v_new.dtype, "one dtype for k_new and v_new"
    k_scale, v_scale, scale_strides = scale_args(ring_k, scales)
    assert slots.shape == head.shape == chunk_len.shape == (B,), "slots/head/chunk_len must be [B]"
    assert slots.dtype == head.dtype == chunk_len.dtype == torch.int64, "int64 slots/head/len"
    assert D & (D - 1) == 0, f"head_dim {D} must be a power of two"
    assert T <= L, f"chunk of {T} tokens exceeds the ring's {L} slots"
    if B == 0 or T == 0:
        return
    block_t = min(triton.next_power_of_2(T), max(1, 4096 // D))  # <= 4K elements per program
    grid = (B, Hkv, triton.cdiv(T, block_t))
    _ring_write_kernel[grid](
        ring_k, ring_v, k_new, v_new, k_scale, v_scale, slots, head, chunk_len,
        *ring_k.stride(), *k_new.stride(), *scale_strides,
        T, L,
        D=D, BLOCK_T=block_t, QUANTIZE=scales is not None,
        enable_fp_fusion=True,  # explicit: Triton 3.10 turns its default off
    )  # fmt: skip
