"""Triton fused sink + ring attention over rotated keys.

Same contract as `reference.sink_ring_attention` (layouts and positions in
reference.py): a chunk of T queries per stream attends, causally, over the
shared sinks, the stream's ring read in place from the pool through `slots`
(no gather copy) and the chunk's own keys. Returns (out [B, H, T, D] in q's
dtype, lse [B, H, T] fp32, natural log).

No RoPE here: every key is stored rotated, once, when it is written (the engine
rotates it at the stream's token position, the sinks at 0..S-1), and the caller
passes each query rotated twice: q_win for the ring and the chunk, q_sink for the
sinks (reference.py says at which positions). So the kernel is plain masked
attention with one dot of depth D per key block, and a key costs only its K/V
bytes: when the kernel rotated keys it also read their fp32 cos/sin rows, as
many bytes again as bf16 K/V (docs/gpu/README.md's next suspect for the 70% of
HBM peak).

One program owns one (stream, kv head) and BLOCK_M query rows, a row being a
(token t, query head g) pair of that kv head's group: with T = 1 (decode)
every K/V byte is read from memory once for all G query heads (GQA). It runs
flash-style: an online softmax over key blocks, sinks first, then the ring's
filled slots oldest to newest, then the chunk.

An int8 ring (`ring_scales` given: the engine's `int8_ring`) is read as int8 and
dequantized in the kernel, each key and value times its (token, kv head) scale, as
`reference.dequantize_int8` defines it: half the bytes of a bf16 ring for the same keys.

Split-K (flash-decoding): when B x Hkv programs cannot fill the GPU, the
filled ring is cut into `num_splits` ranges, each program writes a partial
(out, lse) in fp32 and a second small kernel merges them. Split 0 also takes
the sinks, the last split the chunk.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from logstream.engine.kernels.ring_write import same_layout, scale_args

_LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + a @ b. DOT_F32 feeds exact fp32 copies: Triton's interpreter multiplies
    bf16 operands as their raw uint16 bits (3.9 `create_dot`); on a GPU it is off."""
    if DOT_F32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _load_kv(X, off, SCALE, scale_off, valid, SCALED: tl.constexpr):
    """Keys or values [N, D] at X + off [N, D], rows `valid` [N] (others 0). SCALED: X is
    int8 and each row is returned in fp32 times its scale at SCALE + scale_off [N]."""
    x = tl.load(X + off, mask=valid[:, None], other=0.0)
    if SCALED:
        x = x.to(tl.float32) * tl.load(SCALE + scale_off, mask=valid, other=0.0)[:, None]
    return x


@triton.jit
def _attend_block(
    acc, m_i, l_i, q, K, V, K_SCALE, V_SCALE, key_off, scale_off, visible, valid_k, s_kd, qk_scale,
    D: tl.constexpr, SCALED: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    """One online-softmax step of the rows q [M, D] over a block of keys.

    key_off [N]: element offsets of the keys (pool/sink/chunk layout folded in);
    visible [M, N]: which rows see which keys; valid_k [N]: which keys exist.
    SCALED: K and V are int8, each key's value times K_SCALE / V_SCALE at scale_off [N].
    acc [M, D], m_i and l_i [M] are carried in fp32, m_i in log2 units.
    """
    kv_off = key_off[:, None] + tl.arange(0, D)[None, :] * s_kd  # [N, D]
    k = _load_kv(K, kv_off, K_SCALE, scale_off, valid_k, SCALED).to(q.dtype)
    qk = _dot(q, tl.trans(k), None, PRECISION, DOT_F32)  # [M, N], one dot of depth D
    qk = tl.where(visible, qk * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    v = _load_kv(V, kv_off, V_SCALE, scale_off, valid_k, SCALED).to(q.dtype)  # [N, D]
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, DOT_F32)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _sink_ring_attention_kernel(
    Q_WIN, Q_SINK, K_NEW, V_NEW, SINK_K, SINK_V, RING_K, RING_V, K_SCALE, V_SCALE, SLOTS, HEAD, FILL,
    OUT, LSE,
    s_qb, s_qh, s_qt, s_qd,  # q_win/q_sink [B, H, T, D]
    s_nb, s_nh, s_nt, s_nd,  # k_new/v_new [B, Hkv, T, D]
    s_sh, s_ss, s_sd,  # sink_k/sink_v [Hkv, S, D]
    s_rn, s_rh, s_rl, s_rd,  # ring_k/ring_v [N, Hkv, L, D]
    s_cn, s_ch, s_cl,  # int8 ring's scales [N, Hkv, L, 1]
    s_os, s_ob, s_oh, s_ot,  # out [splits, B, H, T, D] (last dim contiguous)
    s_ls, s_lb, s_lh,  # lse [splits, B, H, T] (last dim contiguous)
    T, S, L, Hkv, qk_scale,
    G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, RING_INT8: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) // Hkv
    kvh = tl.program_id(0) % Hkv
    pid_m = tl.program_id(1)
    split = tl.program_id(2)

    # Rows: r = t * G + g, query head kvh * G + g.
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [M]
    t = r // G
    qh = kvh * G + r % G
    row_ok = r < T * G
    d = tl.arange(0, D)
    slot = tl.load(SLOTS + b)
    head = tl.load(HEAD + b)
    fill = tl.load(FILL + b)
    q_off = b * s_qb + qh[:, None] * s_qh + t[:, None] * s_qt + d[None, :] * s_qd  # [M, D]

    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked block is a no-op
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    n = tl.arange(0, BLOCK_N)

    # Sinks (split 0), seen by every row, scored with q_sink (rotated for the sinks' frame).
    q_sink = tl.load(Q_SINK + q_off, mask=row_ok[:, None], other=0.0)  # [M, D]
    sink_base = kvh * s_sh
    s_end = tl.where(split == 0, S, 0)
    for s0 in range(0, s_end, BLOCK_N):
        s = s0 + n
        ok = s < S
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q_sink, SINK_K + sink_base, SINK_V + sink_base, K_SCALE, V_SCALE, s * s_ss, s,
            row_ok[:, None] & ok[None, :], ok, s_sd, qk_scale, D, False, PRECISION, DOT_F32,
        )  # fmt: skip

    # Ring and chunk: scored with q_win, rotated in the same frame as the keys written.
    q_win = tl.load(Q_WIN + q_off, mask=row_ok[:, None], other=0.0)  # [M, D]

    # Ring: the j-th oldest filled entry (j < fill) has age fill - j, slot (head - age) mod L;
    # row t sees it if t + age <= L - 1. Split-K cuts j into ranges.
    per_split = tl.cdiv(fill, SPLITS)
    j_lo = split * per_split
    j_hi = tl.minimum(j_lo + per_split, fill)
    ring_base = slot * s_rn + kvh * s_rh
    scale_base = slot * s_cn + kvh * s_ch
    for j0 in range(j_lo, j_hi, BLOCK_N):
        j = j0 + n
        ok = j < j_hi
        age = fill - j
        ring_slot = (head - age + L) % L
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q_win, RING_K + ring_base, RING_V + ring_base,
            K_SCALE + scale_base, V_SCALE + scale_base, ring_slot * s_rl, ring_slot * s_cl,
            (t[:, None] + age[None, :] <= L - 1) & ok[None, :], ok,
            s_rd, qk_scale, D, RING_INT8, PRECISION, DOT_F32,
        )  # fmt: skip

    # Chunk (last split): causal; this block's rows need keys j <= t_max.
    chunk_base = b * s_nb + kvh * s_nh
    t_max = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    c_end = tl.where(split == SPLITS - 1, t_max + 1, 0)
    for c0 in range(0, c_end, BLOCK_N):
        j = c0 + n
        ok = j < T
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q_win, K_NEW + chunk_base, V_NEW + chunk_base, K_SCALE, V_SCALE, j * s_nt, j,
            (j[None, :] <= t[:, None]) & ok[None, :], ok, s_nd, qk_scale, D, False, PRECISION, DOT_F32,
        )  # fmt: skip

    # A split that saw no key (l = 0) leaves out = 0 and lse = -inf for the merge.
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse2 = m_i + tl.log2(tl.where(seen, l_i, 1.0))  # log2 units
    lse = tl.where(seen, lse2 * 0.6931471805599453, -float("inf"))
    o_ptr = OUT + split * s_os + b * s_ob + qh[:, None] * s_oh + t[:, None] * s_ot + d[None, :]
    tl.store(o_ptr, out, mask=row_ok[:, None])
    tl.store(LSE + split * s_ls + b * s_lb + qh * s_lh + t, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    PART_OUT, PART_LSE, OUT, LSE, rows,
    SPLITS: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Merge split-K partials: lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s.

    PART_OUT [SPLITS, rows, D] fp32, PART_LSE [SPLITS, rows]; OUT [rows, D], LSE [rows]
    (rows = B x H x T, all contiguous). A split that saw no key has lse_s = -inf,
    weight 0; the last split always sees the query's own key, so lse is finite.
    """
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    ok = r < rows
    d = tl.arange(0, D)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        m = tl.maximum(m, tl.load(PART_LSE + s * rows + r, mask=ok, other=0.0))
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, D], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        w = tl.exp(tl.load(PART_LSE + s * rows + r, mask=ok, other=0.0) - m)  # [R]
        part = tl.load(PART_OUT + (s * rows + r[:, None]) * D + d[None, :], mask=ok[:, None])
        total += w
        acc += w[:, None] * part
    tl.store(OUT + r[:, None] * D + d[None, :], acc / total[:, None], mask=ok[:, None])
    tl.store(LSE + r, m + tl.log(total), mask=ok)


def _launch_config(D: int, block_m: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(key block, warps, pipeline stages) that compile without register spills on sm_80/sm_90.

    Checked by compiling ahead of time for those targets (ptxas resource usage).
    IEEE fp32 dots run on the FMA units and need far more registers than 16-bit
    tensor-core dots, hence smaller blocks. Tuned on an H200 for bf16 decode at
    1,024 full rings (benchmarks/gpu.py's `tune` section, docs/gpu/README.md):
    a third stage took D = 64 from 42% to 50% of HBM peak and D = 128 from 54% to 31%.
    """
    if dtype == torch.float32:
        return (32 if D <= 64 else 16), 8, 2
    return 64, (8 if block_m >= 64 and D >= 128 else 4), (3 if block_m == 16 and D <= 64 else 2)


def _pick_splits(programs: int, L: int, device: torch.device) -> int:
    """Split the ring only when B x Hkv x row blocks leaves SMs idle (flash-decoding).

    Below one program per SM, aim for two waves, each split keeping >= 128 keys;
    the merge costs a few small kernels, so never split a grid that fills the GPU.
    """
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= sms:
        return 1
    return max(1, min(math.ceil(2 * sms / programs), L // 128))


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
    *,
    ring_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_splits: int | None = None,
    launch: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over sinks + ring + itself, keys and queries rotated (see reference.py).

    q_win/q_sink [B, H, T, D] (one layout): the queries rotated for the ring and chunk and for
    the sinks. k_new/v_new [B, Hkv, T, D], sink_k/sink_v [Hkv, S, D],
    ring_k/ring_v [N, Hkv, L, D] (any strides; each pair shares one layout, `same_layout`),
    slots/head/fill [B] int64.
    `ring_scales` (k, v) [N, Hkv, L, 1] fp32: the ring is int8, key i of it
    ring_k[..., i, :] x k_scale[..., i, :] (`reference.dequantize_int8`).
    `num_splits` overrides the split-K heuristic (1 on CPU), `launch` the (key block,
    warps, stages) of `_launch_config` (for tuning). No host sync: the
    call can be captured in a CUDA graph. Returns (out [B, H, T, D] in q's
    dtype, lse [B, H, T] fp32).
    """
    B, H, T, D = q_win.shape
    Hkv, S = sink_k.shape[0], sink_k.shape[1]
    N, L = ring_k.shape[0], ring_k.shape[2]
    dtype = q_win.dtype
    assert dtype in (torch.float32, torch.bfloat16, torch.float16), f"unsupported dtype {dtype}"
    assert H % Hkv == 0, f"{H} query heads are not a multiple of {Hkv} kv heads"
    assert k_new.shape == (B, Hkv, T, D), "k_new/v_new must be [B, Hkv, T, D]"
    assert sink_k.shape == (Hkv, S, D), "sink_k/sink_v must be [Hkv, S, D]"
    assert ring_k.shape == (N, Hkv, L, D), "ring_k/ring_v must be [N, Hkv, L, D]"
    for a, b in ((q_win, q_sink), (k_new, v_new), (sink_k, sink_v), (ring_k, ring_v)):
        assert same_layout(a, b), "each pair (q_win/q_sink, k_new/v_new, sinks, rings) shares one layout"
    ring_dtype = dtype if ring_scales is None else torch.int8
    assert ring_k.dtype == ring_v.dtype == ring_dtype, (
        f"the ring must be {ring_dtype} (int8 with ring_scales)"
    )
    k_scale, v_scale, scale_strides = scale_args(ring_k, ring_scales)
    assert all(x.dtype == dtype for x in (q_sink, k_new, v_new, sink_k, sink_v)), (
        "queries, K/V and sinks share one dtype"
    )
    assert slots.shape == head.shape == fill.shape == (B,), "slots/head/fill must be [B]"
    assert slots.dtype == head.dtype == fill.dtype == torch.int64, "slots/head/fill: int64"
    # q @ k^T is one dot of depth D, and a dot's depth must be >= 16 (Triton 3.6, sm_90).
    assert D >= 16 and D & (D - 1) == 0, f"head_dim {D} must be a power of two >= 16"
    assert 1 <= T <= L, f"chunk of {T} tokens must be 1..L={L}"

    G = H // Hkv
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    # The interpreter runs whole blocks as numpy ops: more rows per program, fewer programs.
    # IEEE fp32 at D >= 128 holds 64 rows only by spilling with Triton 3.6's ptxas: 32 there.
    max_rows = 128 if interpret else (32 if dtype == torch.float32 and D >= 128 else 64)
    block_m = max(16, min(triton.next_power_of_2(T * G), max_rows))
    block_n, num_warps, num_stages = launch or _launch_config(D, block_m, dtype)
    programs = triton.cdiv(T * G, block_m) * B * Hkv
    splits = num_splits or _pick_splits(programs, L, q_win.device)
    assert splits >= 1, "num_splits must be >= 1"

    sink_strides = sink_k.stride()
    if S == 0:  # no sinks: the loop never reads them, but a launch needs a real pointer
        sink_k, sink_v = ring_k, ring_v
    out = torch.empty(B, H, T, D, device=q_win.device, dtype=dtype)
    lse = torch.empty(B, H, T, device=q_win.device, dtype=torch.float32)
    if splits == 1:  # write the result directly
        part_out, part_lse = out[None], lse[None]
    else:
        part_out = torch.empty(splits, B, H, T, D, device=q_win.device, dtype=torch.float32)
        part_lse = torch.empty(splits, B, H, T, device=q_win.device, dtype=torch.float32)
    grid = (B * Hkv, triton.cdiv(T * G, block_m), splits)
    _sink_ring_attention_kernel[grid](
        q_win, q_sink, k_new, v_new, sink_k, sink_v, ring_k, ring_v, k_scale, v_scale, slots, head, fill,
        part_out, part_lse,
        *q_win.stride(), *k_new.stride(), *sink_strides, *ring_k.stride(), *scale_strides,
        *part_out.stride()[:4], *part_lse.stride()[:3],
        T, S, L, Hkv, D**-0.5 * _LOG2E,
        G=G, D=D, SPLITS=splits, RING_INT8=ring_scales is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION="ieee" if dtype == torch.float32 else "tf32", DOT_F32=interpret,
        num_warps=num_warps, num_stages=num_stages,
        enable_fp_fusion=True,  # a * b + c as one FMA: Triton's default until 3.10 turns it off
    )  # fmt: skip
    if splits > 1:
        rows = B * H * T
        block_r = max(1, min(64, 4096 // D))
        _merge_splits_kernel[(triton.cdiv(rows, block_r),)](
            part_out, part_lse, out, lse, rows, SPLITS=splits, D=D, BLOCK_R=block_r, enable_fp_fusion=True
        )
    return out, lse
