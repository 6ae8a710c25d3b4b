"""flash_cpu (torch's fused CPU flash attention, two or three calls merged by logsumexp) equals the reference.

The same cases as the Triton tests, run directly (no interpreter): wrap-around, partial and
empty rings, ragged fills, S in {0, 1, 4, 64}, T in {1, 7, 128}, GQA ratios 1/2/4, L not a
power of two; the live-ring bound and the shared mask give the same numbers as the defaults;
a chunk longer than the ring, in blocks, gives the reference's numbers block by block; with full
rings the entries every query sees take a call of their own. Most of these key counts are not
multiples of 16, so the masked key padding is in every case.
"""

from __future__ import annotations

import pytest
import torch
from kernels_support import Case, make_inputs

from logstream.engine.kernels import flash_cpu, reference

# fp32: the two paths sum in different orders. bf16: flash_cpu rounds its merged output to bf16
# per call (the reference multiplies in fp32) and accumulates per block.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def check(inputs: dict[str, torch.Tensor], dtype: torch.dtype, **kw: object) -> None:
    want_out, want_lse = reference.sink_ring_attention(**inputs)
    got_out, got_lse = flash_cpu.sink_ring_attention(**inputs, **kw)  # type: ignore[arg-type]
    tol = TOLERANCE[dtype]
    assert got_out.dtype == dtype and got_lse.dtype == torch.float32
    torch.testing.assert_close(got_out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("S", [0, 1, 4, 64])
@pytest.mark.parametrize("G", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
def test_decode_step_matches_reference(S: int, G: int) -> None:
    """T = 1 over full, partial, empty and wrapped rings, for sink counts and GQA ratios."""
    c = Case(B=4, H=2 * G, Hkv=2, T=1, S=S, seed=S * 10 + G)
    check(make_inputs(c, fill=[c.L, 5, 0, c.L], head=[3, 5, 0, 0]), c.dtype)


@pytest.mark.parametrize("T", [7, 128])
def test_chunk_is_causal_over_wrapped_ring(T: int) -> None:
    """A chunk of T queries sees the ring (aging out its oldest entries) plus itself, causally."""
    c = Case(B=3, T=T, L=130 if T == 128 else 37, S=4, seed=T)
    check(make_inputs(c, fill=[c.L, c.L - 3, 2], head=[c.L - 2, 7, 2]), c.dtype)


def test_random_fills_and_heads_bf16() -> None:
    """Ragged random fills and heads in bf16, within the stated bf16 tolerance."""
    c = Case(B=5, T=9, S=4, dtype=torch.bfloat16, seed=3)
    check(make_inputs(c), c.dtype)


def test_ring_len_bound_and_shared_mask_change_nothing() -> None:
    """An explicit ring_len (rounded up past the fill) and, with every ring full, the one mask
    shared by all streams give exactly the default's result."""
    c = Case(B=3, T=7, L=100, S=4, seed=5)
    inputs = make_inputs(c, fill=[c.L] * 3, head=[0, 17, 99])
    want = flash_cpu.sink_ring_attention(**inputs)
    for R in (c.L - 1, 99):
        bias = flash_cpu.window_bias(None, c.T, R, c.L, c.dtype)  # [1, 1, T, R + T + E]
        got = flash_cpu.sink_ring_attention(**inputs, ring_len=R, bias=bias)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    partial = make_inputs(c, fill=[40, 3, 0], head=[40, 3, 0])
    want = flash_cpu.sink_ring_attention(**partial)  # R = max fill = 40
    got = flash_cpu.sink_ring_attention(**partial, ring_len=64)  # rounded up: extra entries masked
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("R", "T"), [(127, 128), (2047, 256), (40, 7), (0, 1), (64, 64)])
def test_window_keys_padded_to_a_multiple_and_masked(R: int, T: int) -> None:
    """The window mask spans R + T keys padded to a multiple of KEY_MULTIPLE (torch's CPU kernel
    runs those fastest), and no query sees a padding key."""
    bias = flash_cpu.window_bias(None, T, R, 2048, torch.float32)
    E = bias.shape[-1] - (R + T)
    assert bias.shape[-1] % flash_cpu.KEY_MULTIPLE == 0 and 0 <= E < flash_cpu.KEY_MULTIPLE
    assert torch.isneginf(bias[..., R + T :]).all()


@pytest.mark.parametrize(
    ("L", "fill", "head"),
    [(13, [13, 5, 0], [4, 5, 0]), (300, [300] * 3, [4, 150, 299])],
    ids=["ragged", "open"],
)
def test_blocks_equal_the_reference_one_block_at_a_time(L: int, fill: list[int], head: list[int]) -> None:
    """A chunk of 3 blocks + 2 (longer than the ring at L = 13) in one call, in blocks of P
    queries, equals the reference run a block at a time with each block's K/V written to the
    ring before the next: ragged lengths over full, partial and empty rings; and over full rings
    at L = 300, where each block's newest keys take the open call."""
    P = 11
    c = Case(B=3, T=3 * P + 2, L=L, S=4, seed=7)
    assert (flash_cpu.open_len(P, L - 1, L) > 0) == (L == 300)
    inputs = make_inputs(c, fill=fill, head=head)
    chunk_len = torch.tensor([c.T, 20, P + 1])  # real tokens per stream; the rest is padding
    got_out, got_lse = flash_cpu.sink_ring_attention(**inputs, block=P)  # type: ignore[arg-type]
    assert got_out.shape == inputs["q_win"].shape and got_lse.shape == inputs["q_win"].shape[:3]

    rings = {"ring_k": inputs["ring_k"].clone(), "ring_v": inputs["ring_v"].clone()}  # written block by block
    head, fill = inputs["head"].clone(), inputs["fill"].clone()
    for start in range(0, c.T, P):
        part = slice(start, start + P)
        k, v = inputs["k_new"][:, :, part], inputs["v_new"][:, :, part]
        step = (
            inputs
            | rings
            | {"q_win": inputs["q_win"][:, :, part], "q_sink": inputs["q_sink"][:, :, part]}
            | {"k_new": k, "v_new": v, "head": head, "fill": fill}
        )
        want_out, want_lse = reference.sink_ring_attention(**step)
        n = (chunk_len - start).clamp(0, P)  # [B] real queries in this block
        for b in range(c.B):
            torch.testing.assert_close(
                got_out[b, :, part][:, : n[b]], want_out[b, :, : n[b]], atol=2e-5, rtol=2e-5
            )
            torch.testing.assert_close(
                got_lse[b, :, part][:, : n[b]], want_lse[b, :, : n[b]], atol=2e-5, rtol=2e-5
            )
        reference.ring_write(rings["ring_k"], rings["ring_v"], inputs["slots"], head, k, v, n)
        head, fill = (head + n) % c.L, (fill + n).clamp(max=c.L)


def test_take_gathers_each_streams_newest_entries_oldest_first() -> None:
    """`take(ring, ring_rows(...))` is the advanced index ring[slots, :, (head - R + i) mod L]."""
    c = Case(B=4, L=37, seed=11)
    inputs = make_inputs(c, head=[0, 5, 36, 17])
    ring, slots, head = inputs["ring_k"], inputs["slots"], inputs["head"]
    for R in (0, 1, 20, c.L - 1):
        entry = (head[:, None] - R + torch.arange(R)[None, :]) % c.L  # [B, R]
        want = ring[slots[:, None], :, entry].transpose(1, 2)  # [B, Hkv, R, D]
        assert torch.equal(flash_cpu.take(ring, flash_cpu.ring_rows(ring.shape, slots, head, R)), want)


@pytest.mark.parametrize(
    ("T", "R", "L", "m"),
    [(1, 2047, 2048, 2032), (256, 2047, 2048, 1792), (7, 399, 400, 384), (64, 127, 128, 0)],
)
def test_open_entries_are_seen_by_every_query(T: int, R: int, L: int, m: int) -> None:
    """The open entries (ages 1..m, a multiple of KEY_MULTIPLE) are visible to all T queries in
    the shared mask; fewer than OPEN_MIN (tiny's L = 128) stay in the window call."""
    assert flash_cpu.open_len(T, R, L) == m
    bias = flash_cpu.window_bias(None, T, R, L, torch.float32)  # ring columns oldest first
    assert (bias[..., R - m : R] == 0).all()


@pytest.mark.parametrize("S", [0, 4])
@pytest.mark.parametrize("T", [1, 7, 40])
def test_open_call_matches_reference(S: int, T: int) -> None:
    """Full rings, one block: the newest entries go in a call without a mask, and the three
    (or, without sinks, two) calls merged equal the reference, with the step's shared mask
    passed in as the engine does and computed by default."""
    c = Case(B=3, T=T, L=300, S=S, seed=T + S)
    assert flash_cpu.open_len(T, c.L - 1, c.L) >= flash_cpu.OPEN_MIN  # the case takes the open call
    inputs = make_inputs(c, fill=[c.L] * 3, head=[0, 123, 299])
    check(inputs, c.dtype)
    bias = flash_cpu.window_bias(None, T, c.L - 1, c.L, c.dtype)
    check(inputs, c.dtype, ring_len=c.L - 1, bias=bias)


@pytest.mark.parametrize(
    ("fill", "head"), [([400], [400]), ([599, 450, 300], [17, 450, 300])], ids=["one", "ragged"]
)
def test_open_call_takes_only_filled_entries(fill: list[int], head: list[int]) -> None:
    """Rings not full: the open call takes the entries every stream holds (m <= the least fill)
    and no slot beyond a fill, with ring_len rounded up past the fills and the mask passed in as
    the engine does, one stream (whose mask has one row) or several."""
    c = Case(B=len(fill), T=7, L=600, S=4, seed=len(fill))
    inputs = make_inputs(c, fill=fill, head=head)
    R = min(-(-max(fill) // 64) * 64, c.L - 1)  # engine.ring_len
    assert flash_cpu.open_len(c.T, min(R, min(fill)), c.L) >= flash_cpu.OPEN_MIN  # the case takes it
    bias = flash_cpu.window_bias(flash_cpu.block_fill(inputs["fill"], c.T, c.T), c.T, R, c.L, c.dtype)
    check(inputs, c.dtype, ring_len=R, bias=bias)
    check(inputs, c.dtype)
