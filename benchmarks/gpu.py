"""GPU benchmark of the rolling cache: kernels, a CUDA-graph decode step, engine tokens/s.

    .venv/bin/python benchmarks/gpu.py                     # one CUDA GPU, < 5 minutes
    .venv/bin/python benchmarks/gpu.py --device cpu --quick  # harness smoke run, reference only

Prints markdown tables (paste them into docs/benchmarks.md, "GPU kernels"):

1. Decode attention (T = 1) over full rings, L = 2048, S = 64, head_dim 64
   and 128, 1..1024 streams: kernel time, HBM bytes it must move (ring K/V
   of every stream, sinks once, q/out/new K/V), achieved GB/s and its share
   of the device's peak (memory clock x bus width, or --peak-gbs), the ring
   write's time, and the torch reference's time where it fits in memory.
2. One decode step of a `base`-preset model over 64 streams, eager vs
   captured in a CUDA graph: time per step, what the graph saves, and the
   allocator requests during a replay (must be 0).
3. Engine tokens/s on 32-token lines with full rings: Triton kernels vs the
   torch reference (LOGSTREAM_FORCE_REFERENCE=1) vs a dense baseline that
   recomputes HF's forward over sinks + window for every line.
Plus the KV bytes per stream: layers x 2 x L x kv_heads x head_dim x dtype size.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine import StreamingEngine
from logstream.kernels import reference
from logstream.kernels.dispatch import FORCE_REFERENCE_ENV, ring_write, sink_ring_attention
from logstream.model import PRESETS

HEADS = {64: (16, 4), 128: (32, 8)}  # head_dim -> (query heads, kv heads), Llama-like GQA 4
REFERENCE_MAX_BYTES = 8 << 30  # skip the torch reference where its fp32 temporaries exceed this


@dataclass(frozen=True)
class Sizes:
    L: int
    S: int
    streams: tuple[int, ...]
    engine_streams: int
    line_tokens: int
    steps: int


FULL = Sizes(L=2048, S=64, streams=(1, 4, 16, 64, 256, 1024), engine_streams=64, line_tokens=32, steps=20)
QUICK = Sizes(L=64, S=8, streams=(1, 4), engine_streams=4, line_tokens=8, steps=3)


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds per call; on CUDA via triton's do_bench (L2 flushed between calls)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def peak_gbs(device: torch.device, override: float | None) -> float | None:
    """Spec HBM bandwidth: 2 (DDR) x memory clock x bus width, unless given."""
    if override or device.type != "cuda":
        return override
    p = torch.cuda.get_device_properties(device)
    return 2 * p.memory_clock_rate * 1e3 * p.memory_bus_width / 8 / 1e9


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def cache_inputs(B: int, D: int, sz: Sizes, dtype: torch.dtype, device: torch.device) -> dict:
    """Full rings for B streams (pool of B slots), one new token each, random heads."""
    H, Hkv = HEADS[D]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device=device).float() / D))
    cos, sin = reference.rope_tables(inv_freq, sz.S + 2 * sz.L)
    return {
        "q": randn(B, H, 1, D), "k_new": randn(B, Hkv, 1, D), "v_new": randn(B, Hkv, 1, D),
        "sink_k": randn(Hkv, sz.S, D), "sink_v": randn(Hkv, sz.S, D),
        "ring_k": randn(B, Hkv, sz.L, D), "ring_v": randn(B, Hkv, sz.L, D),
        "slots": torch.randperm(B, device=device),
        "head": torch.randint(0, sz.L, (B,), device=device),
        "fill": torch.full((B,), sz.L, device=device),
        "cos": cos, "sin": sin,
    }  # fmt: skip


def kernel_table(sz: Sizes, dtype: torch.dtype, device: torch.device, peak: float | None) -> None:
    print(f"\n### Decode attention, T = 1, L = {sz.L}, S = {sz.S}, {dtype}, full rings\n")
    print(f"peak HBM: {fmt(peak, '.0f')} GB/s\n")
    print("| D | H/Hkv | streams | splits | attn us | MB moved | GB/s | % peak | write us | reference us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    on_gpu = device.type == "cuda"
    if on_gpu:  # Triton is imported only where it runs
        from logstream.kernels.sink_ring_attention import _pick_splits
    es = torch.tensor([], dtype=dtype).element_size()
    for D in HEADS:
        H, Hkv = HEADS[D]
        for B in sz.streams:
            x = cache_inputs(B, D, sz, dtype, device)
            chunk_len = torch.ones(B, dtype=torch.long, device=device)
            moved = es * (2 * B * Hkv * sz.L * D + 2 * Hkv * sz.S * D + 2 * B * H * D + 2 * B * Hkv * D)
            moved += 4 * B * H  # lse
            attn_ms = write_ms = splits = None
            if on_gpu:
                splits = _pick_splits(B * Hkv, sz.L, device)  # decode: one row block per kv head
                attn_ms = time_ms(lambda x=x: sink_ring_attention(**x), device)
                write_args = [x[k] for k in ("ring_k", "ring_v", "slots", "head", "k_new", "v_new")]
                write_ms = time_ms(lambda a=write_args, n=chunk_len: ring_write(*a, n), device)
            ref_ms = None
            if 4 * B * H * (sz.S + sz.L + 1) * (2 * D + 2) <= REFERENCE_MAX_BYTES:
                ref_ms = time_ms(lambda x=x: reference.sink_ring_attention(**x), device)
            gbs = moved / (attn_ms * 1e-3) / 1e9 if attn_ms else None
            share = 100 * gbs / peak if gbs and peak else None
            print(
                f"| {D} | {H}/{Hkv} | {B} | {fmt(splits, 'd')} | {fmt(attn_ms and attn_ms * 1e3)} "
                f"| {moved / 1e6:.1f} "
                f"| {fmt(gbs, '.0f')} | {fmt(share)} | {fmt(write_ms and write_ms * 1e3)} "
                f"| {fmt(ref_ms and ref_ms * 1e3, '.0f')} |"
            )
            del x
            if on_gpu:
                torch.cuda.empty_cache()


def base_model() -> LlamaForCausalLM:
    """The `base` preset with random weights: speed does not depend on what was learned."""
    p = PRESETS["base"]
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size, num_hidden_layers=p.layers,
        num_attention_heads=p.heads, num_key_value_heads=p.kv_heads, max_position_embeddings=8192,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def decode_step(engine: StreamingEngine, tokens: torch.Tensor, state: dict) -> torch.Tensor:
    """The engine's per-layer forward for one token per stream, on device tensors only.

    tokens [B, 1]; state holds slots, head, fill, chunk_len [B]. Same calls as
    StreamingEngine._step minus its host bookkeeping, so it can be captured.
    """
    x = engine.decoder.embed_tokens(tokens).to(engine.dtype)  # [B, 1, C]
    cache = (state["slots"], state["head"], state["fill"])
    for i, layer in enumerate(engine.layers):
        q, k, v = engine._qkv(layer, x)
        ring = (engine.ring_k[i], engine.ring_v[i])
        sinks = (engine.sink_k[i], engine.sink_v[i])
        out, _ = sink_ring_attention(q, k, v, *sinks, *ring, *cache, engine.cos, engine.sin)
        ring_write(*ring, state["slots"], state["head"], k, v, state["chunk_len"])
        x = engine._finish_layer(layer, x, out)
    return engine._logprobs(x)  # [B, 1, V]


def graph_table(sz: Sizes, dtype: torch.dtype, device: torch.device) -> None:
    print(f"\n### Decode step as a CUDA graph: base preset, {sz.engine_streams} streams, {dtype}\n")
    if device.type != "cuda":
        print("skipped: CUDA graphs need a GPU\n")
        return
    B = sz.engine_streams
    engine = StreamingEngine(base_model(), list(range(1, sz.S + 1)), window=sz.L, max_streams=B, device=device, dtype=dtype)  # fmt: skip
    state = {
        "slots": torch.arange(B, device=device),
        "head": torch.randint(0, sz.L, (B,), device=device),
        "fill": torch.full((B,), sz.L, device=device),
        "chunk_len": torch.ones(B, dtype=torch.long, device=device),
    }
    tokens = torch.randint(0, engine.vocab_size, (B, 1), device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # compile kernels, warm the caching allocator
            decode_step(engine, tokens, state)
    torch.cuda.current_stream().wait_stream(side)
    stats = torch.cuda.memory_stats
    with torch.no_grad():
        segments = stats()["segment.all.allocated"]
        for _ in range(10):
            decode_step(engine, tokens, state)
        torch.cuda.synchronize()
        eager_mallocs = stats()["segment.all.allocated"] - segments  # cudaMalloc calls
        eager_ms = time_ms(lambda: decode_step(engine, tokens, state), device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode_step(engine, tokens, state)
    graph_ms = time_ms(graph.replay, device)
    requests = stats()["allocation.all.allocated"]
    graph.replay()
    torch.cuda.synchronize()
    replay_requests = stats()["allocation.all.allocated"] - requests
    saved = eager_ms - graph_ms
    print("| mode | step us | tokens/s | allocator requests per step | new cudaMalloc segments |")
    print("|---|---|---|---|---|")
    print(f"| eager | {eager_ms * 1e3:.0f} | {B / eager_ms * 1e3:.0f} | > 0 (cached) | {eager_mallocs} |")
    print(f"| CUDA graph | {graph_ms * 1e3:.0f} | {B / graph_ms * 1e3:.0f} | {replay_requests} | 0 |")
    print(f"\ngraph saves {saved * 1e3:.0f} us per step ({100 * saved / eager_ms:.0f}%)\n")


def engine_rate(engine: StreamingEngine, B: int, sz: Sizes, gen: torch.Generator) -> float:
    """Tokens/s scoring one line per stream per call, after every ring has filled."""

    def lines(n: int) -> dict[str, list[list[int]]]:
        ids = torch.randint(3, engine.vocab_size, (B, n, sz.line_tokens), generator=gen).tolist()
        return {f"s{b}": ids[b] for b in range(B)}

    engine.score(lines(math.ceil(sz.L / sz.line_tokens) + 1))  # fill the rings, compile
    batches = [lines(1) for _ in range(sz.steps)]
    start = time.perf_counter()
    for batch in batches:
        engine.score(batch)  # returns host numpy: synchronizes
    return B * sz.line_tokens * sz.steps / (time.perf_counter() - start)


def dense_rate(model: LlamaForCausalLM, B: int, sz: Sizes, device: torch.device) -> float:
    """Tokens/s recomputing HF's forward over sinks + the last L tokens for each new line."""
    T = sz.line_tokens
    ids = torch.randint(3, model.config.vocab_size, (B, sz.S + sz.L), device=device)
    targets = ids[:, -T:]

    @torch.no_grad()
    def step() -> torch.Tensor:
        logits = model(ids, logits_to_keep=T + 1).logits[:, :-1]  # [B, T, V]
        return -F.log_softmax(logits.float(), -1).gather(-1, targets[..., None])

    return B * T / (time_ms(step, device) * 1e-3)


def engine_table(sz: Sizes, dtype: torch.dtype, device: torch.device) -> None:
    B = sz.engine_streams
    print(f"\n### Engine, base preset, {B} streams, {sz.line_tokens}-token lines, L = {sz.L}, {dtype}\n")
    model = base_model()
    sink_ids = list(range(1, sz.S + 1))
    rows = []
    for path, env in (("Triton kernels", "0"), ("torch reference", "1")):
        if path == "Triton kernels" and device.type != "cuda":
            rows.append((path, None))
            continue
        os.environ[FORCE_REFERENCE_ENV] = env
        engine = StreamingEngine(model, sink_ids, window=sz.L, max_streams=B, device=device, dtype=dtype)  # fmt: skip
        rows.append((path, engine_rate(engine, B, sz, torch.Generator().manual_seed(0))))
        per_stream = engine.bytes_per_stream
        del engine
    os.environ.pop(FORCE_REFERENCE_ENV, None)
    rows.append(
        ("dense recompute (HF forward over S + L)", dense_rate(model.to(device, dtype), B, sz, device))
    )
    print("| path | tokens/s |")
    print("|---|---|")
    for path, rate in rows:
        print(f"| {path} | {fmt(rate, '.0f')} |")
    cfg = model.config
    D = cfg.hidden_size // cfg.num_attention_heads
    es = torch.tensor([], dtype=dtype).element_size()
    formula = cfg.num_hidden_layers * 2 * sz.L * cfg.num_key_value_heads * D * es
    print(
        f"\nKV bytes per stream = layers x 2 x L x kv_heads x head_dim x dtype size = "
        f"{cfg.num_hidden_layers} x 2 x {sz.L} x {cfg.num_key_value_heads} x {D} x {es} = "
        f"{formula} ({formula / 2**20:.1f} MiB); engine reports {per_stream}\n"
    )
    assert per_stream == formula, "engine.bytes_per_stream disagrees with the formula"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (harness smoke run)")
    parser.add_argument("--peak-gbs", type=float, help="HBM peak to compare with (GB/s)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU found (use --device cpu --quick for a smoke run)")
    dtype = getattr(torch, args.dtype)
    sz = QUICK if args.quick else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (reference only)"
    print(f"## logstream GPU benchmark on {name}, torch {torch.__version__}")
    started = time.perf_counter()
    kernel_table(sz, dtype, device, peak_gbs(device, args.peak_gbs))
    graph_table(sz, dtype, device)
    engine_table(sz, dtype, device)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
