"""What the CPU step would need for the speed goal: the whole step at 50% of the roofline.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/step_bound.py [--preset small] [--window 2048]
        [--streams 20] [--tokens 256] [--steps 10] [--goal 0.5]

The goal's share is of the whole step's FLOPs (`roofline.engine_flops_per_token` at a full
ring). This measures where a step's time goes and asks what the attention would have to reach
for the step to get there. In one process:

1. `StreamingEngine.device_step` over `--streams` full rings x `--tokens` tokens each (replay's
   steady state; random weights and ring contents, which speed does not depend on): its best
   time, and under `torch.profiler` the self time of torch's CPU flash kernel (attention), of
   the GEMMs, and of the rest (norms, RoPE, SwiGLU, the log-softmax, the ring's gather and
   write, the merge of the attention calls: work the FLOP count leaves out), as shares of the
   best unprofiled step.
2. Attention's two products alone, q k^T and p v, at the tiles a flash kernel computes (128
   query rows x 512 keys, the scores cache-resident): the most the multiply-adds of any
   attention kernel built on this machine's GEMMs reach, before its softmax.
3. The roofline, sampled before and after, the highest of each (`roofline.highest`).

Then `needed_share`: the step's time at the goal, less the GEMMs' and the rest's measured time,
is what attention may take; its FLOPs over that time, as a share of the roofline. Printed with
the rest as measured and as if it cost nothing (null in the JSON where the other parts alone
take longer than the goal's step). The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

import torch
from roofline import best_rate, engine_flops_per_token, highest, measure
from torch.profiler import profile
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.presets import PRESETS
from logstream.engine.streaming import StreamingEngine

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
# a flash kernel's query and key blocks (torch's CPU one takes 512 keys, and 32-256 queries by
# their count): a tile's scores stay in L2
TILE_ROWS, TILE_KEYS = 128, 512


def part_of(op: str) -> str:
    """A profiled op's part of the step: attention, gemm, or rest."""
    if "scaled_dot_product" in op:
        return "attention"
    return "gemm" if op in GEMM_OPS else "rest"


def needed_share(step_flops: float, attention_flops: float, other_seconds: float, peak: float, goal: float) -> float:  # fmt: skip
    """The share of the roofline `peak` that attention must reach for the whole step to reach
    `goal` of it, when the step's other parts take `other_seconds`: inf if they alone take longer."""
    budget = step_flops / (goal * peak) - other_seconds
    return attention_flops / budget / peak if budget > 0 else float("inf")


def share_text(share: float) -> str:
    """A share as a percentage, or why there is none (`needed_share`'s inf)."""
    return f"{share:.0%}" if math.isfinite(share) else "more than all (the other parts alone take longer)"


def tile_products(head_dim: int, seconds: float, tiles: int = 160, batch: int = 8) -> dict[str, float]:
    """FLOP/s of q k^T ([128, D] x [D, 512]) and p v ([128, 512] x [512, D]) over `tiles` tiles,
    `batch` to a call, each call's output small enough to stay in cache; `roofline.best_rate`."""
    q, kt = torch.randn(batch, TILE_ROWS, head_dim), torch.randn(batch, head_dim, TILE_KEYS)
    p, v = torch.randn(batch, TILE_ROWS, TILE_KEYS), torch.randn(batch, TILE_KEYS, head_dim)
    scores, out = torch.empty(batch, TILE_ROWS, TILE_KEYS), torch.empty(batch, TILE_ROWS, head_dim)
    calls, flops = tiles // batch, 2.0 * tiles * TILE_ROWS * TILE_KEYS * head_dim

    def qk() -> None:
        for _ in range(calls):
            torch.bmm(q, kt, out=scores)

    def pv() -> None:
        for _ in range(calls):
            torch.bmm(p, v, out=out)

    return {"qk": best_rate(qk, flops, seconds), "pv": best_rate(pv, flops, seconds)}


def full_ring_step(preset: str, window: int, streams: int, tokens: int, sinks: int) -> tuple[Callable[[], object], LlamaConfig]:  # fmt: skip
    """One device step of `streams` full rings x `tokens` tokens, as a call, and the model's config."""
    p = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        max_position_embeddings=4 * window + sinks, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    engine = StreamingEngine(
        LlamaForCausalLM(config).eval(), list(range(1, sinks + 1)), window=window, max_streams=streams, device="cpu"
    )  # fmt: skip
    engine.ring_k.normal_()
    engine.ring_v.normal_()
    slots = torch.arange(streams)
    position = torch.randint(window, 4 * window, (streams,))  # every ring full, heads anywhere
    chunk_len = torch.full((streams,), tokens)
    ids = torch.randint(3, p.vocab_size, (streams, tokens))
    previous = engine.initial_logprobs.expand(streams, -1)
    ring_len = engine.ring_len(position.clamp(max=window).numpy())

    def step() -> object:
        return engine.device_step(ids, previous, slots, position, chunk_len, ring_len, fill_all=True)

    return step, config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--sinks", type=int, default=95, help="as cpu_speed.py's trained model has")
    parser.add_argument("--streams", type=int, default=20, help="cpu_speed.py's 16 hosts make 20 streams")
    parser.add_argument("--tokens", type=int, default=256, help="a stream's chunk in one step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--goal", type=float, default=0.5, help="of the roofline, for the whole step")
    parser.add_argument("--tokens-per-line", type=float, default=20.9, help="cpu_speed.py's synthetic log")
    parser.add_argument("--roofline-seconds", type=float, default=1.0)
    args = parser.parse_args()
    step, config = full_ring_step(args.preset, args.window, args.streams, args.tokens, args.sinks)
    head_dim = config.hidden_size // config.num_attention_heads
    # the ceilings and the tile products, sampled before and after the step: the highest of each
    samples = [measure(args.roofline_seconds)]
    product_samples = [tile_products(head_dim, args.roofline_seconds)]

    for _ in range(3):
        step()
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    seconds = min(times)  # the best, as cpu_speed.py keeps: the kindest to the goal
    with profile() as prof:
        for _ in range(min(args.steps, 5)):
            step()
    self_us = {"attention": 0.0, "gemm": 0.0, "rest": 0.0}
    for event in prof.key_averages():
        self_us[part_of(event.key)] += event.self_cpu_time_total
    part_seconds = {name: seconds * us / sum(self_us.values()) for name, us in self_us.items()}
    samples.append(measure(args.roofline_seconds))
    product_samples.append(tile_products(head_dim, args.roofline_seconds))
    products = {name: max(s[name] for s in product_samples) for name in ("qk", "pv")}
    roof = highest(samples)
    peak = roof.fp32_flops

    token_count = args.streams * args.tokens
    per_token = engine_flops_per_token(config, args.sinks, args.window)
    matmul_per_token = engine_flops_per_token(config, 0, 0)
    flops = {
        "attention": token_count * (per_token - matmul_per_token),
        "gemm": token_count * matmul_per_token,
        "rest": 0.0,
    }
    step_flops = token_count * per_token
    need = {
        "rest_as_measured": needed_share(
            step_flops, flops["attention"], part_seconds["gemm"] + part_seconds["rest"], peak, args.goal
        ),
        "rest_free": needed_share(step_flops, flops["attention"], part_seconds["gemm"], peak, args.goal),
    }
    lines_per_second = token_count / seconds / args.tokens_per_line

    print(
        f"roofline: fp32 GEMM {peak / 1e9:.1f} GFLOP/s, the highest of {len(samples)} samples "
        f"({', '.join(f'{s.fp32_flops / 1e9:.1f}' for s in samples)})"
    )
    print(
        f"step: {args.streams} streams x {args.tokens} tokens, full rings of {args.window} + {args.sinks} sinks: "
        f"{seconds * 1e3:.1f} ms (best of {args.steps}), {lines_per_second:,.0f} lines/s at "
        f"{args.tokens_per_line} tokens a line, {step_flops / seconds / peak:.1%} of the roofline"
    )
    print(f"{'part':<10} {'ms':>7} {'of step':>8} {'GFLOP/s':>8} {'of roofline':>12}")
    for name, s in part_seconds.items():
        rate = flops[name] / s if flops[name] else None
        print(
            f"{name:<10} {s * 1e3:7.1f} {s / seconds:8.0%} "
            + (f"{rate / 1e9:8.1f} {rate / peak:12.0%}" if rate else f"{'-':>8} {'-':>12}")
        )
    print(
        f"attention's products alone, {TILE_ROWS} x {TILE_KEYS} tiles: q k^T {products['qk'] / 1e9:.1f} GFLOP/s "
        f"({products['qk'] / peak:.0%}), p v {products['pv'] / 1e9:.1f} ({products['pv'] / peak:.0%})"
    )
    goal_seconds = step_flops / (args.goal * peak)
    print(
        f"the goal, {args.goal:.0%} of the roofline: a step of {goal_seconds * 1e3:.1f} ms "
        f"({token_count / goal_seconds / args.tokens_per_line:,.0f} lines/s). Attention would need "
        f"{share_text(need['rest_as_measured'])} of the roofline with the rest as measured, "
        f"{share_text(need['rest_free'])} if the rest cost nothing"
    )
    print(
        json.dumps(
            {
                "args": vars(args),
                "roofline_fp32_samples": [s.fp32_flops for s in samples],
                "roofline_fp32": peak,
                "step_seconds": seconds,
                "step_flops": step_flops,
                "lines_per_second": lines_per_second,
                "part_seconds": part_seconds,
                "part_flops": flops,
                "tile_products_flops": products,
                "goal_step_seconds": goal_seconds,
                "attention_share_needed": {k: v if math.isfinite(v) else None for k, v in need.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
