"""Sink + ring attention on CPU through torch's fused flash attention (SDPA), same contract as reference.py.

The reference materializes scores [B, H, T, S + L + T] in fp32 and runs five elementwise
passes over them (mask, logsumexp, exp, ...): on a CPU that is memory-bound and took 99% of
the engine's time. Here the scores never leave the cache: torch's CPU flash kernel
(`_scaled_dot_product_flash_attention_for_cpu`, an online softmax over key blocks, GQA
native) runs two or three times and the parts are merged by their logsumexps (`merge`):

    1. sinks: q_sink against the sink keys (no mask);
    2. window: q_win against the ring's newest R entries gathered oldest first, then the chunk,
       so that every stream shares one mask (keys come rotated, so their order is free);
    3. open: the newest m of the R keys before a block of queries, which all of them see (m
       no more than any stream's fill), leave the window call for one of their own, without a
       mask (`open_len`); at a full ring of L = 2048 that is most of the keys.
    out = sum of out_i * exp(lse_i - lse), lse = logaddexp of the lse_i.

The ring's rows are gathered with one `index_select` over whole rows (`ring_rows`, `take`).
Two queries can't share one call because their rotations differ (a single call with
q = [q_sink, q_win] of depth 2D would need K depth != V depth, which the CPU flash kernel does
not take: it falls back to the slow math path).

`ring_len` R: how many of the newest ring entries any query may see. An entry of age r is
visible to query t iff r <= fill and t + r <= L - 1, so R = min(max fill, L - 1) is exact;
streams that have not filled their ring (short sessions) attend over their own length only.

`block` P: a chunk longer than the ring (the engine gives a stream several chunks in one step
when few streams are active) is cut into blocks of P <= L queries, each a row of one batch:
block b sees the R = L - 1 keys before it and itself, X[bP : bP + R + P] of X = [ring; chunk].
That is the window of P queries that a step of its own would see, so a step of n blocks does
the attention of n steps at once, in one kernel call, with no extra work per query.

Key padding: torch's CPU flash kernel runs a key sequence whose length is a multiple of 16 up to
1.8x faster than one key shorter (255 window keys, 95 sinks; docs/benchmarks.md). So the masked
calls take zero keys up to the next multiple of `KEY_MULTIPLE` (their order is free), and the
open call a multiple of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KEY_MULTIPLE = 16
# Fewer open ring entries than this stay in the window call: below it the extra call and merge
# cost more than the mask they save (tiny at L = 128: 64-96 open entries, 2% slower a step).
OPEN_MIN = 256


def key_padding(n: int) -> int:
    """The masked keys that take a sequence of n keys to a multiple of KEY_MULTIPLE."""
    return -n % KEY_MULTIPLE


def flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias) v with its logsumexp: (out [B, H, T, D], lse [B, H, T] fp32).

    q [B, H, T, D]; k, v [B, Hkv, N, D] (H a multiple of Hkv); bias broadcasts to [B, H, T, N].
    """
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=scale
    )
    return out, lse.float()


def live_ring_len(fill: torch.Tensor, L: int) -> int:
    """R = min(max fill, L - 1): ring entries older than that are invisible to every query."""
    return min(int(fill.max()), L - 1) if fill.numel() else 0


def ring_rows(shape: torch.Size, slots: torch.Tensor, head: torch.Tensor, R: int) -> torch.Tensor:
    """Rows of a ring [N, Hkv, L, D] viewed as [N * Hkv * L, D] that hold each stream's newest R
    entries, oldest first: slots, head [B] -> [B, Hkv, R]."""
    _, Hkv, L, _ = shape
    entry = (head[:, None] - R + torch.arange(R, device=head.device)[None, :]) % L  # [B, R]
    row = (slots[:, None] * Hkv + torch.arange(Hkv, device=head.device)[None, :]) * L  # [B, Hkv]
    return row[:, :, None] + entry[:, None, :]


def take(ring: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """ring [N, Hkv, L, D], rows [B, Hkv, R] from `ring_rows` -> [B, Hkv, R, D].

    `index_select` over whole rows of D values copies each row at once: 3-4x as fast as the
    advanced index ring[slots[:, None], :, entry], or x[rows] (docs/benchmarks.md).
    """
    D = ring.shape[-1]
    return ring.view(-1, D).index_select(0, rows.reshape(-1)).view(*rows.shape, D)


def open_len(T: int, R: int, L: int) -> int:
    """m: how many of the newest R ring entries every one of T queries sees (ages 1..m, with
    t + age <= L - 1 for t < T), rounded down to a multiple of KEY_MULTIPLE; 0 below OPEN_MIN.
    R here is at most every stream's fill. They take a call of their own, without a mask."""
    m = min(R, L - T) // KEY_MULTIPLE * KEY_MULTIPLE
    return m if m >= OPEN_MIN else 0


def merge(
    parts: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over disjoint key sets, each (out [B, H, T, D], lse [B, H, T]), as one over their
    union: out = sum of out_i * exp(lse_i - lse), lse = logaddexp of all lse_i."""
    if len(parts) == 1:
        return parts[0]
    total = parts[0][1]
    for _, lse in parts[1:]:
        total = torch.logaddexp(total, lse)  # [B, H, T]
    out, lse = parts[0]
    merged = out.float() * torch.exp(lse - total)[..., None]
    for out, lse in parts[1:]:
        merged = merged + out.float() * torch.exp(lse - total)[..., None]
    return merged.to(dtype), total


def blocks(x: torch.Tensor, P: int) -> torch.Tensor:
    """x [B, H, T, D] -> [B * nb, H, P, D], T padded to nb * P: block b is x[:, :, bP : bP + P]."""
    B, H, T, D = x.shape
    nb = -(-T // P)
    if nb == 1:
        return x
    x = F.pad(x, (0, 0, 0, nb * P - T))
    return x.view(B, H, nb, P, D).transpose(1, 2).reshape(B * nb, H, P, D)


def unblocks(x: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """The inverse of `blocks` for [B * nb, H, P, ...] -> [B, H, T, ...]."""
    if x.shape[0] == B:
        return x
    nb, H, P = x.shape[0] // B, x.shape[1], x.shape[2]
    x = x.view(B, nb, *x.shape[1:]).transpose(1, 2)  # [B, H, nb, P, ...]
    return x.reshape(B, H, nb * P, *x.shape[4:])[:, :, :T]


def windows(x: torch.Tensor, nb: int, P: int, size: int) -> torch.Tensor:
    """x [B, Hkv, N, D] -> [B * nb, Hkv, size, D]: block b's keys x[:, :, bP : bP + size], zeros past N."""
    B, Hkv, N, D = x.shape
    if nb == 1 and size == N:
        return x
    need = (nb - 1) * P + size  # the keys nb windows span
    x = F.pad(x, (0, 0, 0, need - N)) if need > N else x[:, :, :need]
    return x.unfold(2, size, P).permute(0, 2, 1, 4, 3).reshape(B * nb, Hkv, size, D)


def block_fill(fill: torch.Tensor, T: int, P: int) -> torch.Tensor:
    """fill [B] -> [B * nb]: the entries before block b, fill + bP (block b's own fill)."""
    nb = -(-T // P)
    return (fill[:, None] + P * torch.arange(nb, device=fill.device)[None]).reshape(-1)


def window_bias(fill: torch.Tensor | None, T: int, R: int, L: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, T, R + T + E]: 0 where query t sees window key i, -inf elsewhere.

    Ring key i (age R - i) is visible if filled (age <= fill) and within the window
    (t + age <= L - 1); chunk key j if j <= t (causal); the E = `key_padding(R + T)` keys
    after them never. `fill=None` means every stream has at least R entries: then the mask
    is the same for all streams, [1, 1, T, R + T + E].
    """
    device = fill.device if fill is not None else None
    t = torch.arange(T, device=device)
    age = R - torch.arange(R, device=device)  # [R], oldest first
    ring_visible = t[None, :, None] + age[None, None, :] <= L - 1  # [1, T, R]
    if fill is not None:
        ring_visible = ring_visible & (age[None, None, :] <= fill[:, None, None])  # [B, T, R]
    causal = (t[None, :] <= t[:, None]).expand(ring_visible.shape[0], T, T)  # [B, T, T]
    padding = causal.new_zeros(()).expand(ring_visible.shape[0], T, key_padding(R + T))  # [B, T, E]
    visible = torch.cat([ring_visible, causal, padding], dim=-1)  # [B, T, R + T + E]
    bias = torch.zeros(visible.shape, device=device, dtype=dtype)
    return bias.masked_fill_(~visible, float("-inf"))[:, None]  # [B, 1, T, R + T + E]


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
    ring_len: int | None = None,
    bias: torch.Tensor | None = None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over sinks + ring + itself: (out [B, H, T, D], lse [B, H, T] fp32).

    Layouts as in reference.py, except that T may exceed L when `block` P (<= L) is given: the
    queries then go in blocks of P (module docstring). `ring_len` (default: from `fill`, a host
    sync; L - 1 with several blocks) and `bias` (default: `window_bias(block_fill(fill, T, P),
    P, ring_len, L, q_win.dtype)`, or with fill None when every fill is at least ring_len) may be
    passed in, so that a caller computes them once per step for all layers.
    """
    B, _, T, D = q_win.shape
    S, L = sink_k.shape[1], ring_k.shape[2]
    P = T if block is None else min(block, T)
    if ring_len is None:
        ring_len = live_ring_len(fill, L) if P == T else L - 1
    R = ring_len
    assert P == T or R == L - 1, "blocks after the first see the L - 1 keys before them"
    scale = D**-0.5

    min_fill = int(fill.min()) if fill.numel() else 0
    if bias is None:  # one mask for all streams when every one holds the R entries
        bias = window_bias(None if min_fill >= R else block_fill(fill, T, P), P, R, L, q_win.dtype)
    # Each block of P queries sees the R keys before it, oldest first, and its own P keys: for
    # the first block the ring's newest R entries and the chunk's first P tokens; for block b,
    # X[bP : bP + R] and X[bP + R : bP + R + P] of X = [ring entries; chunk]. The newest m of
    # the R keys (`open_len`) all its queries see: they go in a call of their own, unmasked.
    nb, E = -(-T // P), key_padding(R + P)
    m = open_len(P, min(R, min_fill), L)  # ages 1..m: every stream holds them
    rows = ring_rows(ring_k.shape, slots, head, R)  # [B, Hkv, R]

    def zeros(x: torch.Tensor) -> torch.Tensor:
        """E zero keys [batch, Hkv, E, D] for x [batch, Hkv, n, D] (a view: cat copies them)."""
        return x.new_zeros(()).expand(x.shape[0], x.shape[1], E, D)

    def keys(ring: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Each block's open keys [B * nb, Hkv, m, D] (None if m = 0) and window keys
        [B * nb, Hkv, R - m + P + E, D]: the other R - m before it, its own P and E masked zeros."""
        before = take(ring, rows)  # [B, Hkv, R, D]
        if not m:
            return None, windows(torch.cat([before, new, zeros(new)], dim=2), nb, P, R + P + E)
        if nb > 1:
            before, new = windows(torch.cat([before, new], dim=2), nb, P, R), blocks(new, P)
        return before[:, :, R - m :], torch.cat([before[:, :, : R - m], new, zeros(new)], dim=2)

    (k_open, k_seq), (v_open, v_seq) = keys(ring_k, k_new), keys(ring_v, v_new)
    q, parts = blocks(q_win, P), []  # q [B * nb, H, P, D]; parts: (out [B, H, T, D], lse [B, H, T])
    if k_open is not None and v_open is not None:
        out, lse = flash(q, k_open, v_open, None, scale)
        parts.append((unblocks(out, B, T), unblocks(lse, B, T)))
        bias = torch.cat([bias[..., : R - m], bias[..., R:]], dim=-1)  # without their columns (all 0)
    out, lse = flash(q, k_seq, v_seq, bias, scale)
    parts.append((unblocks(out, B, T), unblocks(lse, B, T)))

    # Sinks: every query sees all S of them, and none of the zeros that pad them to a multiple of 16.
    if S:
        pad = key_padding(S)
        sink_k, sink_v = (F.pad(x, (0, 0, 0, pad))[None].expand(B, -1, -1, -1) for x in (sink_k, sink_v))
        sink_bias = None
        if pad:
            sink_bias = torch.zeros(1, 1, 1, S + pad, device=q_sink.device, dtype=q_sink.dtype)
            sink_bias[..., S:] = float("-inf")
        parts.append(flash(q_sink, sink_k, sink_v, sink_bias, scale))
    return merge(parts, q_win.dtype)
