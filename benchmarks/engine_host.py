"""The engine's host bookkeeping per call, without its device step.

    .venv/bin/python benchmarks/engine_host.py [--streams 1024] [--line-tokens 32] [--calls 10]

`StreamingEngine.score` over `--streams` streams, one line of `--line-tokens` random tokens per
stream per call (the shape of `benchmarks/gpu.py`'s engine rows), with `step_fn` set to a no-op
that returns zeros: what is left is the host's share of a call (chunking, the cache
positions, per-stream state, the copy back and the split into lines). On a GPU that share
bounds `engine.score` at many streams (docs/gpu/README.md); on this machine it can be timed
alone. Then the same with the real step (`tiny` preset, random weights, L = 128), for scale.
Median of `--calls` after 5 warm-up calls. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.presets import PRESETS
from logstream.engine.streaming import StreamingEngine


def no_step(tokens: torch.Tensor, previous: torch.Tensor, *_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """`device_step`'s signature and output shapes, no work: nll [B, T] zeros, last = previous [B, V]."""
    return torch.zeros(tokens.shape), previous


def ms_per_call(engine: StreamingEngine, streams: int, line_tokens: int, calls: int) -> float:
    generator = torch.Generator().manual_seed(1)
    times = []
    for call in range(5 + calls):
        lines = {
            f"s{i}": [torch.randint(3, engine.vocab_size, (line_tokens,), generator=generator).tolist()]
            for i in range(streams)
        }
        started = time.perf_counter()
        engine.score(lines)
        if call >= 5:
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--line-tokens", type=int, default=32)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    p = PRESETS["tiny"]
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
    )  # fmt: skip
    engine = StreamingEngine(
        LlamaForCausalLM(config), list(range(1, 9)), window=128, max_streams=args.streams, device="cpu"
    )
    result = {"streams": args.streams, "line_tokens": args.line_tokens}
    for name, step in (("host_only", no_step), ("with_tiny_step", None)):
        engine.step_fn = step
        ms = ms_per_call(engine, args.streams, args.line_tokens, args.calls)
        result[name] = {"ms_per_call": round(ms, 2), "us_per_stream": round(1e3 * ms / args.streams, 2)}
        print(f"{name}: {ms:.1f} ms a call, {1e3 * ms / args.streams:.1f} µs a stream")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
