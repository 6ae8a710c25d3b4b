"""The compiled Triton kernels on a real GPU: the reference's results, no allocations, CUDA graphs.

Skipped without CUDA (the CPU run of the same kernels is tests/engine/kernels/test_triton.py,
under Triton's interpreter) and when TRITON_INTERPRET=1 is set in this process,
which would interpret instead of compiling.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from kernels_support import Case, make_inputs
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.kernels import reference
from logstream.engine.kernels.dispatch import backend_for, ring_write, sink_ring_attention
from logstream.engine.streaming import StreamingEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="TRITON_INTERPRET=1 would interpret, not compile, the kernels",
    ),
]
# fp32 dots run in IEEE fp32. 16-bit: P is rounded to the cache dtype for P @ V, as in
# flash attention, which the fp32 reference does not do.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def check(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    want_out, want_lse = reference.sink_ring_attention(**inputs)
    got_out, got_lse = sink_ring_attention(**inputs)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got_out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [16, 64, 128])
@pytest.mark.parametrize("T", [1, 7, 128])
def test_attention_matches_reference_on_gpu(dtype: torch.dtype, D: int, T: int) -> None:
    """Decode and chunks, wrapped/partial/empty rings, GQA 4, L not a power of two; head_dim 16
    is the least a dot's depth allows, in 16-bit too."""
    c = Case(B=6, H=8, Hkv=2, T=T, D=D, S=64, L=300, dtype=dtype, seed=T + D)
    fill = [300, 299, 0, 17, 300, 150]
    head = [0, 299, 0, 17, 123, 7]
    x = make_inputs(c, fill=fill, head=head, device="cuda")
    assert backend_for(x["q_win"]) == "triton"
    check(x, dtype)


def test_split_k_heuristic_on_gpu() -> None:
    """One stream, few kv heads: the wrapper splits the ring over the SMs and still matches."""
    from logstream.engine.kernels.sink_ring_attention import _pick_splits  # Triton: imported where it runs

    c = Case(B=1, H=8, Hkv=1, T=1, D=128, S=16, L=2048, dtype=torch.bfloat16, seed=3)
    assert _pick_splits(programs=1, L=c.L, device=torch.device("cuda")) > 1
    check(make_inputs(c, fill=[2048], head=[1000], device="cuda"), c.dtype)


def test_ring_write_matches_reference_and_allocates_nothing() -> None:
    """Ragged chunks land where the reference puts them; the call makes no allocator request."""
    c = Case(B=5, Hkv=2, T=64, D=128, L=300, dtype=torch.bfloat16, seed=9)
    x = make_inputs(c, head=[299, 0, 250, 5, 100], device="cuda")
    chunk_len = torch.tensor([64, 0, 64, 1, 33], device="cuda")
    args = [x["slots"], x["head"], x["k_new"], x["v_new"], chunk_len]
    want_k, want_v = x["ring_k"].clone(), x["ring_v"].clone()
    reference.ring_write(want_k, want_v, *args)
    ring_write(x["ring_k"], x["ring_v"], *args)  # warm-up: compiles
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    ring_write(x["ring_k"], x["ring_v"], *args)  # same data again: idempotent
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert torch.equal(x["ring_k"], want_k) and torch.equal(x["ring_v"], want_v)


def test_decode_step_replays_as_cuda_graph() -> None:
    """Attention + ring write captured once replay with new inputs, matching eager, zero allocations."""
    c = Case(B=16, H=8, Hkv=2, T=1, D=64, S=32, L=256, dtype=torch.bfloat16, seed=4)
    x = make_inputs(c, device="cuda")
    chunk_len = torch.ones(c.B, dtype=torch.long, device="cuda")
    keys = ("q_win", "q_sink", "k_new", "v_new", "head", "fill")

    def step() -> torch.Tensor:
        out, _ = sink_ring_attention(**x)
        ring_write(x["ring_k"], x["ring_v"], x["slots"], x["head"], x["k_new"], x["v_new"], chunk_len)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile and warm the allocator outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    new = make_inputs(replace(c, seed=5), device="cuda")
    for k in keys:
        x[k].copy_(new[k])
    want = sink_ring_attention(**x)[0]  # eager, before the replay writes the ring
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    torch.testing.assert_close(static_out, want, atol=0, rtol=0)


def two_layer_llama(init_std: float) -> LlamaForCausalLM:
    """A random 2-layer Llama (V = 101, C = 128, 4 / 2 heads); a larger init_std peaks its predictions."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=101, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=init_std,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def engine_scores(init_std: float) -> dict[str, torch.Tensor]:
    """Token NLLs of 3 streams x 12 lines (the 40-slot rings wrap): CPU fp32, CUDA fp32, CUDA bf16,
    and CPU and CUDA fp32 with an int8 ring.

    The CPU run takes the torch reference, the CUDA runs the Triton kernels. A larger
    init_std gives peaked next-token distributions, so the NLLs are not all near log(V).
    """
    model = two_layer_llama(init_std)
    gen = torch.Generator().manual_seed(1)
    lines = {
        f"s{i}": [torch.randint(3, 101, (9,), generator=gen).tolist() for _ in range(12)] for i in range(3)
    }
    scores = {}
    for name, device, dtype in (("cpu", "cpu", torch.float32), ("cuda", "cuda", torch.float32),
                                ("cuda-bf16", "cuda", torch.bfloat16), ("cpu-int8", "cpu", torch.float32),
                                ("cuda-int8", "cuda", torch.float32)):  # fmt: skip
        engine = StreamingEngine(
            model, [1, 2, 3, 4], window=40, max_streams=3, chunk_tokens=16, device=device, dtype=dtype,
            int8_ring=name.endswith("int8"),
        )  # fmt: skip
        out = engine.score(lines)  # 108 tokens per stream: the 40-slot ring wraps
        scores[name] = torch.stack([torch.from_numpy(x) for s in lines for x in out[s]]).float()  # [36, 9]
    return scores


def test_engine_on_gpu_scores_like_cpu_reference() -> None:
    """StreamingEngine on CUDA (Triton kernels) gives the CPU reference's token NLLs to 1e-3."""
    scores = engine_scores(init_std=0.02)
    torch.testing.assert_close(scores["cuda"], scores["cpu"], rtol=1e-3, atol=1e-4)


def test_engine_int8_ring_on_gpu_scores_like_cpu_int8() -> None:
    """An int8 ring on CUDA (quantized by the ring write kernel, dequantized in the attention
    kernel) gives the CPU int8 engine's token NLLs to 1e-3."""
    scores = engine_scores(init_std=0.1)
    torch.testing.assert_close(scores["cuda-int8"], scores["cpu-int8"], rtol=1e-3, atol=1e-3)


def test_engine_bf16_on_gpu_within_stated_tolerance() -> None:
    """bf16 engine vs the fp32 CPU reference: line means within 2%, tokens within 5% (docs/gpu/README.md)."""
    scores = engine_scores(init_std=0.1)
    want, got = scores["cpu"], scores["cuda-bf16"]
    torch.testing.assert_close(got.mean(-1), want.mean(-1), rtol=2e-2, atol=1e-3)  # line scores
    torch.testing.assert_close(got, want, rtol=5e-2, atol=1e-3)  # token NLLs


def test_engine_replays_bucketed_cuda_graphs_with_eager_scores() -> None:
    """`BucketedStep` on CUDA: 5 streams of ragged lines (1-23 tokens, 40-slot rings wrap) run
    as captured graphs of padded shapes, with the eager engine's token NLLs and rings; a second
    pass over the same shapes captures nothing new."""
    from logstream.engine.cuda_graphs import BucketedStep

    model = two_layer_llama(init_std=0.1)
    gen = torch.Generator().manual_seed(2)
    lengths = {"a": (23, 1, 9), "b": (5,), "c": (2, 2, 17, 3), "d": (11, 6), "e": (1,)}
    batches = [
        {s: [torch.randint(3, 101, (n,), generator=gen).tolist() for n in lengths[s]] for s in lengths}
        for _ in range(6)
    ]
    engines, results = [], []
    for graphs in (False, True):
        engine = StreamingEngine(
            model, [1, 2, 3, 4], window=40, max_streams=5, chunk_tokens=16, device="cuda"
        )
        step = engine.step_fn = BucketedStep(engine) if graphs else None
        results.append([engine.score(batch) for batch in batches[:3]])
        captured = len(step.graphs) if step else 0
        results[-1] += [engine.score(batch) for batch in batches[3:]]  # the same shapes again
        assert not step or (captured >= 2 and len(step.graphs) == captured)
        engines.append(engine)
    for want, got in zip(*results, strict=True):
        for s in lengths:
            for w, g in zip(want[s], got[s], strict=True):
                torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(w), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(engines[1].ring_k, engines[0].ring_k, rtol=1e-4, atol=1e-4)
