"""Triton kernels equal the torch reference, run by Triton's interpreter on CPU.

The kernels run in a worker process with TRITON_INTERPRET=1 (see
kernels_support.py for why not in this process); the reference runs here.
Shapes are small because the interpreter is slow, but every case that changes
the control flow is covered: wrap-around, partial and empty rings, ragged
chunks, S in {0, 1, 4, 64}, T in {1, 7, 128}, GQA ratios 1/2/4, L not a power
of two, split-K, strided inputs and the three dtypes. q_win and q_sink are
independent random tensors, so a kernel that scored the sinks or the window with
the other query fails every case with sinks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from kernels_support import Case, Interpreter, make_inputs
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.kernels import reference
from logstream.engine.kernels.dispatch import FORCE_REFERENCE_ENV, FORCE_TRITON_ENV, backend_for, ring_write
from logstream.engine.streaming import StreamingEngine

ATTENTION = "logstream.engine.kernels.sink_ring_attention:sink_ring_attention"
# fp32 matches to rounding. bf16: the interpreter truncates fp32 -> bf16 (a GPU rounds to
# nearest) and the kernel feeds P in bf16 to the P @ V product, as flash attention does.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}


@pytest.fixture(scope="module")
def interpreter() -> Iterator[Interpreter]:
    worker = Interpreter()
    yield worker
    worker.close()


def check_attention(interpreter: Interpreter, inputs: dict, dtype: torch.dtype, **kw) -> None:
    want_out, want_lse = reference.sink_ring_attention(**inputs)
    got_out, got_lse = interpreter.call(ATTENTION, **inputs, **kw)
    tol = TOLERANCE[dtype]
    assert got_out.dtype == dtype and got_lse.dtype == torch.float32
    torch.testing.assert_close(got_out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("S", [1, 4, 64])
@pytest.mark.parametrize("G", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
def test_decode_step_matches_reference(interpreter: Interpreter, S: int, G: int) -> None:
    """T = 1 over full, partial, empty and wrapped rings, for sink counts and GQA ratios."""
    c = Case(B=4, H=2 * G, Hkv=2, T=1, S=S, seed=S * 10 + G)
    inputs = make_inputs(c, fill=[c.L, 5, 0, c.L], head=[3, 5, 0, 0])
    check_attention(interpreter, inputs, c.dtype)


@pytest.mark.parametrize("T", [7, 128])
def test_chunk_is_causal_over_wrapped_ring(interpreter: Interpreter, T: int) -> None:
    """A chunk of T queries sees the ring (aging out its oldest entries) plus itself, causally."""
    c = Case(B=3, T=T, L=130 if T == 128 else 37, S=4, seed=T)
    inputs = make_inputs(c, fill=[c.L, c.L - 3, 2], head=[c.L - 2, 7, 2])
    check_attention(interpreter, inputs, c.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_matches_reference(interpreter: Interpreter, dtype: torch.dtype) -> None:
    """16-bit caches give the reference's output to 16-bit accuracy; lse stays fp32."""
    c = Case(B=3, H=4, Hkv=2, T=7, D=32, dtype=dtype, seed=5)
    check_attention(interpreter, make_inputs(c), dtype)


@pytest.mark.parametrize("splits", [2, 3])
def test_split_k_merge_matches_reference(interpreter: Interpreter, splits: int) -> None:
    """Cutting the ring into ranges and merging partial softmaxes changes nothing (incl. fill 0)."""
    c = Case(B=4, H=8, Hkv=2, T=3, seed=40 + splits)
    inputs = make_inputs(c, fill=[c.L, 11, 0, 1], head=[9, 11, 0, c.L - 1])
    check_attention(interpreter, inputs, c.dtype, num_splits=splits)


def test_no_sinks_matches_reference(interpreter: Interpreter) -> None:
    """S = 0 (an engine without a pattern prompt) attends to the window only."""
    c = Case(S=0, T=5, seed=7)
    check_attention(interpreter, make_inputs(c), c.dtype)


def test_strided_inputs_match_reference(interpreter: Interpreter) -> None:
    """Queries and k/v as the engine passes them ([B, T, H, D] transposed) are read in place."""
    c = Case(B=2, T=6, seed=11)
    inputs = make_inputs(c)
    for name in ("q_win", "q_sink", "k_new", "v_new"):
        inputs[name] = inputs[name].transpose(1, 2).contiguous().transpose(1, 2)
    assert not inputs["q_win"].is_contiguous()
    check_attention(interpreter, inputs, c.dtype)


def test_pairs_may_differ_in_size_one_strides(interpreter: Interpreter) -> None:
    """No index multiplies a size-1 dim's stride, and torch sets it freely (the engine's rotated
    k_new at T = 1 has another than its v_new): such a pair is still one layout."""
    c = Case(B=3, T=1, seed=12)
    inputs = make_inputs(c)
    for name in ("q_sink", "v_new"):
        x = inputs[name]
        inputs[name] = x.as_strided(x.shape, (*x.stride()[:2], 12345, 1))  # T's stride
    assert inputs["v_new"].stride() != inputs["k_new"].stride()
    check_attention(interpreter, inputs, c.dtype)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_match_reference(interpreter: Interpreter, seed: int) -> None:
    """Seeded random B, heads, GQA ratio, T, D, S and L (mostly not powers of two)."""
    g = torch.Generator().manual_seed(100 + seed)

    def pick(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    Hkv, L = pick(1, 3), pick(5, 70)
    c = Case(
        B=pick(1, 5), Hkv=Hkv, H=Hkv * pick(1, 4), T=pick(1, min(L, 20)),
        D=(16, 32)[pick(0, 1)], S=pick(0, 9), L=L, seed=seed,
    )  # fmt: skip
    check_attention(interpreter, make_inputs(c), c.dtype)


def ring_write_returning(**inputs: Any) -> tuple[torch.Tensor, ...]:
    """Worker side: the dispatch's ring write, returning the rings (and int8 scales) it wrote."""
    from logstream.engine.kernels.dispatch import ring_write

    ring_write(**inputs)
    return inputs["ring_k"], inputs["ring_v"], *(inputs.get("scales") or ())


@pytest.mark.parametrize(
    ("dtype", "T", "L"), [(torch.float32, 7, 37), (torch.bfloat16, 1, 13), (torch.float32, 64, 67)]
)
def test_ring_write_matches_reference(interpreter: Interpreter, dtype: torch.dtype, T: int, L: int) -> None:
    """Ragged chunks (0..T tokens) land at (head + i) mod L, wrapping; nothing else changes."""
    c = Case(B=4, T=T, L=L, dtype=dtype, seed=T)
    x = make_inputs(c, head=[L - 2, 0, 5, L - 1])
    chunk_len = torch.tensor([T, 0, max(1, T // 2), T])
    args = {k: x[k] for k in ("ring_k", "ring_v", "slots", "head", "k_new", "v_new")}
    for name in ("k_new", "v_new"):  # the engine's layout: [B, T, Hkv, D] transposed
        args[name] = args[name].transpose(1, 2).contiguous().transpose(1, 2)
    want_k, want_v = args["ring_k"].clone(), args["ring_v"].clone()
    reference.ring_write(want_k, want_v, x["slots"], x["head"], x["k_new"], x["v_new"], chunk_len)
    got_k, got_v = interpreter.call("test_triton:ring_write_returning", **args, chunk_len=chunk_len)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def int8_ring(inputs: dict) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
    """The case with its rings quantized (int8 K/V) and their scales [N, Hkv, L, 1]."""
    (k8, k_scale), (v8, v_scale) = (
        reference.quantize_int8(inputs["ring_k"]),
        reference.quantize_int8(inputs["ring_v"]),
    )
    return {**inputs, "ring_k": k8, "ring_v": v8}, (k_scale, v_scale)


@pytest.mark.parametrize(
    ("dtype", "T", "splits"), [(torch.float32, 5, 1), (torch.float32, 1, 2), (torch.bfloat16, 3, 1)]
)
def test_int8_ring_reads_as_its_dequantized_values(
    interpreter: Interpreter, dtype: torch.dtype, T: int, splits: int
) -> None:
    """An int8 ring with its scales attends as the reference over the dequantized ring
    (`reference.dequantize_int8`): full, partial, empty and wrapped rings, decode with split-K."""
    c = Case(B=4, H=4, Hkv=2, T=T, D=32, dtype=dtype, seed=20 + T)
    inputs = make_inputs(c, fill=[c.L, 9, 0, c.L], head=[4, 9, 0, c.L - 1])
    quantized, scales = int8_ring(inputs)
    dequantized = [
        reference.dequantize_int8(quantized[k], s, dtype)
        for k, s in zip(("ring_k", "ring_v"), scales, strict=True)
    ]
    want_out, want_lse = reference.sink_ring_attention(
        **{**inputs, "ring_k": dequantized[0], "ring_v": dequantized[1]}
    )
    got_out, got_lse = interpreter.call(ATTENTION, **quantized, ring_scales=scales, num_splits=splits)
    tol = TOLERANCE[dtype]
    assert got_out.dtype == dtype
    torch.testing.assert_close(got_out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse, want_lse, atol=tol, rtol=tol)


def test_int8_ring_write_quantizes_as_the_reference(interpreter: Interpreter) -> None:
    """Into an int8 ring the kernel writes the reference's int8 values and scales, bit for bit,
    ties rounded to even (one token's values are its scale times k + 0.5); nothing else changes."""
    c = Case(B=4, T=7, L=13, seed=8)
    x = make_inputs(c, head=[11, 0, 5, 12])
    k_new = x["k_new"].clone()
    k_new[0, 0, 0] = torch.tensor(
        [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 63.5, -63.5] + [0.0] * 7
    )  # scale 1
    N, L, D = x["ring_k"].shape[0], c.L, c.D
    rings = [torch.zeros(N, c.Hkv, L, D, dtype=torch.int8) for _ in range(2)]
    scales = [torch.ones(N, c.Hkv, L, 1) for _ in range(2)]
    chunk_len = torch.tensor([7, 0, 3, 7])
    want = [t.clone() for t in (*rings, *scales)]
    args = {
        "slots": x["slots"],
        "head": x["head"],
        "k_new": k_new,
        "v_new": x["v_new"],
        "chunk_len": chunk_len,
    }
    ring_write(*want[:2], **args, scales=tuple(want[2:]))  # this process: the reference (CPU)
    got = interpreter.call(
        "test_triton:ring_write_returning",
        ring_k=rings[0],
        ring_v=rings[1],
        **args,
        scales=tuple(scales),
    )
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    slot = int(x["slots"][0])
    assert got[0][slot, 0, 11].tolist()[:9] == [127, 0, 2, 2, 0, -2, -2, 64, -64]


def int8_engine_scores() -> list[np.ndarray]:
    """Token NLLs of an engine with an int8 ring: 3 streams x 6 lines, the 13-slot rings wrap."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
    )  # fmt: skip
    engine = StreamingEngine(
        LlamaForCausalLM(config), [1, 7, 11], window=13, max_streams=3, chunk_tokens=5, device="cpu",
        int8_ring=True,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    lines = {
        f"s{i}": [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (4, 9, 1, 6, 3, 8)]
        for i in range(3)
    }
    out = engine.score(lines)
    return [line for s in lines for line in out[s]]


def test_engine_int8_ring_through_the_kernels_scores_as_on_cpu(interpreter: Interpreter) -> None:
    """The int8 engine through the Triton kernels (quantizing ring write, dequantizing attention)
    gives the CPU int8 engine's token NLLs."""
    got = interpreter.call("test_triton:int8_engine_scores")
    want = int8_engine_scores()
    assert len(got) == len(want) == 18
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_dispatch_follows_device_and_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors take flash_cpu unless LOGSTREAM_FORCE_TRITON=1; FORCE_REFERENCE wins."""
    x = torch.zeros(1)
    monkeypatch.delenv(FORCE_TRITON_ENV, raising=False)
    monkeypatch.delenv(FORCE_REFERENCE_ENV, raising=False)
    assert backend_for(x) == "flash_cpu"
    monkeypatch.setenv(FORCE_TRITON_ENV, "1")
    assert backend_for(x) == "triton"
    monkeypatch.setenv(FORCE_REFERENCE_ENV, "1")
    assert backend_for(x) == "reference"
