"""Training speed of `fit()`: tokens/s and FLOP/s against this machine's roofline, per lever.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/train_speed.py [--preset small] [--steps 8]
        [--sessions 20000] [--levers eager,compile,bf16_autocast]

Prepares training exactly as `train()` does on the HDFS normal training sessions (the 80/20
split of benchmarks/quality.py's HDFS case, the first `--sessions`): tokenizer, pattern prompt,
window, examples. Then runs `fit()` for `--steps` steps per lever, interleaved, twice, best
time kept (compile's first run includes compiling). Reports:

- tokens/s: log tokens (what the loss is on) per second, and rows x (S + T) processed
  tokens per second (sinks and padding included);
- FLOP/s: forward + backward = 3 x the forward, per row 2 x matmul MACs x (S + T) plus causal
  attention 4 x layers x H x D x (S + T)(S + T + 1)/2, over the padded batch;
- the share of log tokens among processed ones (what packing or sink caching could win).

The roofline is sampled at the start and after each round of levers; shares divide by the
highest sample (`roofline.highest`).

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from roofline import engine_flops_per_token, highest, measure

from logstream.consumers.inputs import InputStats, read_sessions, streams_from_sessions
from logstream.engine.model import PRESETS, build_model
from logstream.engine.tokenizer import LineTokenizer, prompt_ids, train_tokenizer
from logstream.lifecycle.train import (
    TrainConfig,
    fit,
    heldout_split,
    make_examples,
    mask_streams,
    plan_window,
    sink_budget,
)
from logstream.text.normalize import Normalizer
from logstream.text.patterns import mine, pattern_prompt

DATA = Path("../shared/data/hdfs/train_sessions.jsonl")
LEVERS = {"eager": {}, "compile": {"compile": True}, "bf16_autocast": {"autocast": torch.bfloat16}}


def batch_shapes(
    n_examples: int, lengths: list[int], config: TrainConfig, steps: int
) -> list[tuple[int, int]]:
    """(rows, T) of each of fit()'s first `steps` batches: its sampling, replayed."""
    rng, order, shapes = random.Random(config.seed), [], []
    for _ in range(steps):
        if len(order) < config.batch_size:
            order += rng.sample(range(n_examples), n_examples)
        batch = [lengths[order.pop()] for _ in range(min(config.batch_size, n_examples))]
        shapes.append((len(batch), max(batch)))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--levers", default="eager,compile,bf16_autocast")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    samples = [measure(1.0)]  # and again after each repetition: the highest of each ceiling counts

    sessions = read_sessions(args.data, InputStats())
    train_sessions = sessions[: int(len(sessions) * 0.8)][: args.sessions]
    config = TrainConfig(preset=args.preset)
    streams, _ = heldout_split(streams_from_sessions([s for s in train_sessions if s.label == 0]), config)
    normalizer = Normalizer()
    masked = [normalizer.mask(line) for s in streams for line in s.lines]
    tokenizer = LineTokenizer(train_tokenizer(masked, PRESETS[args.preset].vocab_size))
    prompt = pattern_prompt(mine(masked).templates(), config.prompt_templates)
    window = plan_window(sum(map(len, tokenizer.encode_lines(masked))), config.window)
    sink_ids = prompt_ids(tokenizer, prompt, sink_budget(config, window))
    torch.manual_seed(config.seed)
    model = build_model(args.preset, tokenizer, max_positions=len(sink_ids) + window)
    encoded = [tokenizer.encode_lines(masked) for masked in mask_streams(streams, normalizer)]
    examples = make_examples(streams, encoded, tokenizer.eos_id, window)

    S, cfg = len(sink_ids), model.config
    shapes = batch_shapes(len(examples), [len(ids) for ids, _, _ in examples], config, args.steps)
    log_tokens = sum(  # the loss's tokens: replayed batches' real lengths are not kept, so estimate
        rows * (sum(len(ids) for ids, _, _ in examples) / len(examples)) for rows, _ in shapes
    )
    processed = sum(rows * (S + T) for rows, T in shapes)
    matmul = engine_flops_per_token(cfg, 0, 0)  # 2 x MACs per token
    per_key = engine_flops_per_token(cfg, 0, 1) - matmul  # 4 x layers x H x D
    flops = 3 * sum(rows * (matmul * (S + T) + per_key * (S + T) * (S + T + 1) / 2) for rows, T in shapes)

    best: dict[str, float] = {}
    for _ in range(2):
        for name in args.levers.split(","):
            trial = copy.deepcopy(model)
            started = time.perf_counter()
            fit(trial, examples, sink_ids, replace(config, max_steps=args.steps), **LEVERS[name])
            seconds = time.perf_counter() - started
            best[name] = min(best.get(name, seconds), seconds)
        samples.append(measure(1.0))
    roof = highest(samples)
    rows = []
    for name, seconds in best.items():
        dtype = LEVERS[name].get("autocast", torch.float32)
        rows.append({
            "lever": name, "seconds_per_step": round(seconds / args.steps, 3),
            "log_tokens_per_second": round(log_tokens / seconds), "processed_tokens_per_second": round(processed / seconds),
            "gflops": round(flops / seconds / 1e9, 2),
            "flops_share": round(roof.fraction(flops / seconds, 0.0, dtype)["flops_share"], 3),
        })  # fmt: skip
        print(rows[-1])
    print(json.dumps({
        "preset": args.preset, "window": window, "sinks": S, "examples": len(examples),
        "mean_example_tokens": round(sum(len(ids) for ids, _, _ in examples) / len(examples), 1),
        "log_token_share": round(log_tokens / processed, 3), "steps": args.steps, "levers": rows,
        "roofline_fp32_gflops": round(roof.fp32_flops / 1e9, 1), "roofline_bf16_gflops": round(roof.bf16_flops / 1e9, 1),
        "roofline_fp32_samples": [round(s.fp32_flops / 1e9, 1) for s in samples],
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "threads": torch.get_num_threads(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
