"""GPU check of the rolling cache: scores vs the CPU reference, kernel GB/s, CUDA graphs, engine rates.

    python3 benchmarks/gpu.py --out $OUT          # one CUDA GPU; benchmarks/gpu_check.sh runs it
    .venv/bin/python benchmarks/gpu.py --rehearse --out /tmp/gpu-rehearsal   # CPU, tiny shapes

Sections, each under a hard time budget (a row that would start after its section's
budget is spent is recorded as skipped, with the reason, and the run goes on):

  env      versions, GPU, spec HBM peak and a measured device-to-device copy
  correct  StreamingEngine token NLLs on the GPU (Triton) vs the CPU torch reference:
           fp32 within 1e-3 relative, bf16 within BF16_TOLERANCE (stated below)
  kernels  decode attention (T = 1, full rings) and the ring write: us, bytes, GB/s, % of peak
  graph    one decode step of the model, eager vs a CUDA graph: speed-up at small batch, and
           the device-only lines/s of a 32-token line step at 1,024 streams
  engine   StreamingEngine.score (host bookkeeping included): lines/s and tokens/s at
           1..8,192 streams, KV bytes per stream (formula and measured), peak memory per stream

`--rehearse` runs every section on CPU with tiny shapes, the kernels in Triton's
interpreter (TRITON_INTERPRET=1, LOGSTREAM_FORCE_TRITON=1; the process re-executes
itself with them set before anything imports Triton). Only CUDA timing, graph capture
and GPU memory counters are skipped there; its numbers say nothing about a GPU.

Writes under --out: bench.json (rewritten after every section), bench.md (the tables)
and summary.txt (the targets with the measured figures: docs/gpu/README.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from logstream.engine.cuda_graphs import BucketedStep, capture
from logstream.engine.kernels import reference
from logstream.engine.kernels.dispatch import FORCE_REFERENCE_ENV, ring_write, sink_ring_attention
from logstream.engine.model import PRESETS
from logstream.engine.streaming import StreamingEngine

INTERPRET_ENV = {"TRITON_INTERPRET": "1", "LOGSTREAM_FORCE_TRITON": "1"}
# Vendor datasheet HBM bandwidth (GB/s) by a substring of the device name; first match wins.
SPEC_PEAK_GBS = {"H200": 4800.0, "H100 NVL": 3900.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100": 2039.0}
# fp32 on both sides: token NLL within 1e-3 relative (|gpu - cpu| / max(|cpu|, 0.01 nats)).
FP32_RTOL = 1e-3
# bf16 engine vs the fp32 CPU reference: weights, activations and the cache are rounded to
# 8 mantissa bits, so a line's mean NLL may move by up to 2% and a single token's by 5%.
BF16_TOLERANCE = {"line_rtol": 2e-2, "token_rtol": 5e-2}
NLL_FLOOR = 0.01  # nats: relative errors divide by max(|reference|, this)
SECTIONS = ("env", "correct", "kernels", "graph", "engine", "tune")


# -- the plan: shapes and budgets, one frozen table per mode --------------------------------------


@dataclass(frozen=True)
class Plan:
    L: int  # ring slots per stream (window)
    S: int  # sink tokens
    kernel_heads: tuple[tuple[int, int, int], ...]  # (head_dim, query heads, kv heads)
    kernel_streams: tuple[int, ...]
    reference_max_streams: int  # time the torch reference kernel up to this many streams
    check_preset: str  # model for the correctness section
    check_streams: int
    check_window: int
    graph_rows: tuple[tuple[str, int, int], ...]  # (preset, streams, tokens per step)
    engine_rows: tuple[tuple[str, int, str], ...]  # (preset, streams, path), in run order
    line_tokens: int
    steps: int  # timed engine.score calls per row
    copy_bytes: int  # device-to-device copy for the measured bandwidth ceiling
    tune_shapes: tuple[tuple[int, int, int, int], ...]  # (head_dim, query heads, kv heads, chunk T)
    tune_streams: int
    tune_launches: tuple[tuple[int, int, int], ...]  # (key block, warps, stages), beside the default
    budgets_s: dict[str, float] = field(default_factory=dict)  # per section


FULL = Plan(
    L=2048, S=64,
    kernel_heads=((64, 16, 4), (128, 32, 8)),
    kernel_streams=(1, 16, 64, 256, 1024),
    reference_max_streams=64,
    check_preset="small", check_streams=4, check_window=256,
    graph_rows=(("small", 1, 1), ("base", 1, 1), ("small", 64, 1), ("base", 64, 1),
                ("small", 1024, 32), ("base", 1024, 32)),
    # Most important first: the goal row (small, 1,024 streams), then what explains it.
    engine_rows=(("small", 1024, "triton"), ("small", 1024, "graphs"), ("small", 1024, "int8"),
                 ("small", 64, "triton"), ("small", 64, "graphs"), ("small", 1, "triton"), ("small", 1, "graphs"),
                 ("base", 1024, "triton"), ("small", 8192, "triton"), ("base", 64, "triton"),
                 ("small", 64, "reference"), ("small", 64, "dense"), ("base", 1, "triton"),
                 ("base", 8192, "triton")),
    line_tokens=32, steps=10, copy_bytes=4 << 30,
    # The small preset's engine step first (D = 32, G = 2, T = 32), then the goal's decode shapes.
    # On the H200, 8 warps, 4 stages and 256-key blocks were slower or did not fit (docs/gpu/README.md).
    tune_shapes=((32, 4, 2, 32), (64, 16, 4, 1), (128, 32, 8, 1)), tune_streams=1024,
    tune_launches=tuple((n, w, st) for n in (32, 64, 128) for w in (2, 4) for st in (2, 3)),
    budgets_s={"env": 20, "correct": 45, "kernels": 60, "graph": 50, "engine": 110, "tune": 90},
)  # fmt: skip
REHEARSE = Plan(
    L=64, S=8,
    kernel_heads=((32, 4, 2),),
    kernel_streams=(1, 3),
    reference_max_streams=3,
    check_preset="tiny", check_streams=2, check_window=32,
    graph_rows=(("tiny", 1, 1), ("tiny", 2, 8)),
    engine_rows=(("tiny", 2, "triton"), ("tiny", 1, "triton"), ("tiny", 2, "reference"),
                 ("tiny", 2, "dense"), ("tiny", 3, "graphs"), ("tiny", 2, "int8")),
    line_tokens=8, steps=2, copy_bytes=1 << 20,
    tune_shapes=((32, 4, 2, 1),), tune_streams=2, tune_launches=((32, 4, 2), (64, 4, 3)),
    budgets_s={"env": 10, "correct": 30, "kernels": 20, "graph": 20, "engine": 40, "tune": 30},
)  # fmt: skip
PLANS = {"full": FULL, "rehearse": REHEARSE}


# -- output ------------------------------------------------------------------------------------------


class Report:
    """bench.json (rewritten after each section, so a killed run keeps what it measured) + bench.md."""

    def __init__(self, out: Path, plan_name: str) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"plan": plan_name, "sections": {}, "goals": []}
        self.md: list[str] = []

    def text(self, line: str = "") -> None:
        print(line, flush=True)
        self.md.append(line)

    def table(self, rows: list[dict[str, Any]], columns: list[str]) -> None:
        self.text("| " + " | ".join(columns) + " |")
        self.text("|" + "---|" * len(columns))
        for row in rows:
            self.text("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
        self.text()

    def save(self) -> None:
        tmp = self.out / "bench.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out / "bench.json")
        (self.out / "bench.md").write_text("\n".join(self.md) + "\n")


def fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


class Budget:
    """A section's deadline: `left()` seconds remain; rows check it before they start."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


@contextmanager
def section(report: Report, name: str, seconds: float) -> Iterator[dict[str, Any]]:
    """Record a section's status, rows and wall time; an exception fails the section, not the run."""
    entry: dict[str, Any] = {"status": "ok", "budget_s": seconds, "rows": [], "skipped": []}
    report.data["sections"][name] = entry
    report.text(f"\n## {name}\n")
    start = time.perf_counter()
    try:
        yield entry
    except Exception as e:  # one section's failure must not cost the others their device time
        entry.update(status="failed", error=f"{type(e).__name__}: {e}")
        report.text(f"**{name} failed**: {type(e).__name__}: {e}\n")
        traceback.print_exc()
    finally:
        entry["seconds"] = round(time.perf_counter() - start, 1)
        if entry["skipped"] and entry["status"] == "ok":
            entry["status"] = "partial"
        for skip in entry["skipped"]:
            report.text(f"- skipped {skip['row']}: {skip['reason']}")
        if on_cuda():
            torch.cuda.empty_cache()
        report.save()


def skip(entry: dict[str, Any], row: Any, reason: str) -> None:
    entry["skipped"].append({"row": str(row), "reason": reason})


# -- helpers -----------------------------------------------------------------------------------------

DEVICE = torch.device("cpu")  # set in main()


def on_cuda() -> bool:
    return DEVICE.type == "cuda"


def sync() -> None:
    if on_cuda():
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object]) -> float:
    """Median ms per call: triton's do_bench on CUDA (events, L2 flushed between calls), else a clock."""
    if on_cuda():
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(|want|, NLL_FLOOR), elementwise."""
    got, want = got.double().cpu(), want.double().cpu()
    return float(((got - want).abs() / want.abs().clamp_min(NLL_FLOOR)).max())


def norm_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (METHOD.md's measure for kernel outputs)."""
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm())


def random_model(preset: str, init_std: float = 0.02) -> LlamaForCausalLM:
    """A preset's architecture with seeded random weights (speed does not depend on training).

    init_std > 0.02 gives peaked next-token distributions, so NLL comparisons are not
    trivially passed by a near-uniform model.
    """
    p = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        max_position_embeddings=8192, initializer_range=init_std, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def kv_bytes_per_stream(preset: str, L: int, dtype: torch.dtype, int8: bool = False) -> int:
    """layers x 2 x L x kv_heads x head_dim x dtype size; an int8 ring: x (head_dim + 4 for its fp32 scale)."""
    p = PRESETS[preset]
    per_key = p.hidden_size // p.heads * torch.tensor([], dtype=dtype).element_size()
    if int8:
        per_key = p.hidden_size // p.heads + 4
    return p.layers * 2 * L * p.kv_heads * per_key


def random_lines(vocab: int, streams: int, n: int, tokens: int, seed: int) -> dict[str, list[list[int]]]:
    """n lines of `tokens` ids per stream ("s0", "s1", ...), ids >= 3 (past the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (streams, n, tokens), generator=g).tolist()
    return {f"s{b}": ids[b] for b in range(streams)}


@contextmanager
def torch_reference(on: bool) -> Iterator[None]:
    """Route the kernels to the torch reference (LOGSTREAM_FORCE_REFERENCE=1) inside the block."""
    old = os.environ.get(FORCE_REFERENCE_ENV)
    os.environ[FORCE_REFERENCE_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(FORCE_REFERENCE_ENV)
        else:
            os.environ[FORCE_REFERENCE_ENV] = old


# -- env -----------------------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    import numpy
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "triton": triton_version, "transformers": transformers.__version__, "numpy": numpy.__version__,
        "interpret": os.environ.get("TRITON_INTERPRET") == "1", "host": platform.node(),
    }  # fmt: skip
    if on_cuda():
        p = torch.cuda.get_device_properties(DEVICE)
        env.update(
            gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
            gpu_memory_gib=round(p.total_memory / 2**30, 1), l2_mib=getattr(p, "L2_cache_size", 0) / 2**20,
        )  # fmt: skip
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            env["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            env["nvidia_smi"] = f"unavailable: {e}"
    return env


def spec_peak_gbs(override: float | None) -> tuple[float | None, str]:
    """HBM peak: --peak-gbs, else the datasheet figure by name, else 2 x memory clock x bus width."""
    if override:
        return override, "--peak-gbs"
    if not on_cuda():
        return None, "no GPU"
    p = torch.cuda.get_device_properties(DEVICE)
    for key, gbs in SPEC_PEAK_GBS.items():
        if key in p.name:
            return gbs, f"datasheet ({key})"
    clock, width = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    if clock and width:  # kHz, bits; CUDA 13 dropped the clock from the properties (then 0)
        return 2 * clock * 1e3 * width / 8 / 1e9, "2 x memory clock x bus width"
    return None, "unknown device: pass --peak-gbs"


def run_env(report: Report, plan: Plan, args: argparse.Namespace, budget: Budget) -> None:
    with section(report, "env", budget.seconds) as entry:
        env = versions()
        peak, source = spec_peak_gbs(args.peak_gbs)
        env.update(peak_gbs=peak, peak_source=source)
        n = plan.copy_bytes // 2
        src = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        ms = time_ms(lambda src=src, dst=dst: dst.copy_(src))
        env["copy_gbs"] = 2 * plan.copy_bytes / (ms * 1e-3) / 1e9  # bytes read + written
        del src, dst
        report.data["env"] = env
        entry["rows"].append(env)
        for key, value in env.items():
            report.text(f"- {key}: {fmt(value)}")


# -- correct: engine scores on the device vs the CPU reference ----------------------------------------


def engine_nll(
    model: torch.nn.Module, plan: Plan, lines: dict[str, list[list[int]]], device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """Token NLLs of every line, concatenated in stream order: [n_tokens] fp32 on CPU."""
    engine = StreamingEngine(
        model, list(range(1, plan.S + 1)), window=plan.check_window, max_streams=plan.check_streams,
        chunk_tokens=plan.check_window // 2, device=device, dtype=dtype,
    )  # fmt: skip
    out = engine.score(lines)
    return torch.cat([torch.from_numpy(x).float() for s in lines for x in out[s]])


def line_means(nll: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    return torch.stack([part.mean() for part in nll.split(lengths)])


def run_correct(report: Report, plan: Plan, budget: Budget) -> None:
    with section(report, "correct", budget.seconds) as entry:
        preset = plan.check_preset
        model = random_model(preset, init_std=0.1)
        g = torch.Generator().manual_seed(1)
        # Ragged lines, 3x the window per stream: the ring wraps, chunks straddle lines.
        n_tokens = 3 * plan.check_window
        lines: dict[str, list[list[int]]] = {}
        for b in range(plan.check_streams):
            ids, stream = torch.randint(3, PRESETS[preset].vocab_size, (n_tokens,), generator=g).tolist(), []
            while ids:
                n = int(torch.randint(4, 24, (1,), generator=g))
                stream.append(ids[:n])
                ids = ids[n:]
            lines[f"s{b}"] = stream
        lengths = [len(x) for s in lines for x in lines[s]]
        with torch_reference(True):
            want = engine_nll(model, plan, lines, torch.device("cpu"), torch.float32)
        report.text(f"{preset} preset, init std 0.1, {plan.check_streams} streams x {n_tokens} tokens, "
                    f"L = {plan.check_window}, S = {plan.S}; reference: CPU torch, fp32")  # fmt: skip
        report.text(f"reference NLL: mean {want.mean():.3f}, std {want.std():.3f} nats\n")
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            if budget.left() < 5:
                skip(entry, name, f"section budget spent ({budget.seconds:.0f} s)")
                continue
            with torch_reference(False):
                got = engine_nll(model, plan, lines, DEVICE, dtype)
            token_err = rel_err(got, want)
            line_err = rel_err(line_means(got, lengths), line_means(want, lengths))
            if dtype == torch.float32:
                passed, tolerance = token_err <= FP32_RTOL, f"token rel <= {FP32_RTOL:g}"
            else:
                line_tol, token_tol = BF16_TOLERANCE["line_rtol"], BF16_TOLERANCE["token_rtol"]
                passed = line_err <= line_tol and token_err <= token_tol
                tolerance = f"line rel <= {line_tol:g}, token rel <= {token_tol:g}"
            entry["rows"].append({
                "dtype": name, "tokens": len(want), "token_max_rel_err": token_err,
                "token_max_abs_err": float((got - want).abs().max()), "line_max_rel_err": line_err,
                "tolerance": tolerance, "pass": passed,
            })  # fmt: skip
        cols = ["dtype", "tokens", "token_max_rel_err", "token_max_abs_err", "line_max_rel_err", "tolerance", "pass"]  # fmt: skip
        report.table(entry["rows"], cols)
        if any(not r["pass"] for r in entry["rows"]):
            entry["status"] = "failed"


# -- kernels: decode attention and the ring write --------------------------------------------------


def cache_inputs(
    B: int, D: int, H: int, Hkv: int, plan: Plan, dtype: torch.dtype, T: int = 1
) -> dict[str, torch.Tensor]:
    """Full rings for B streams (pool of B slots), T new tokens each, random heads. Keys and
    queries stand for rotated ones: the kernel applies no RoPE, so any values do."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE, dtype=dtype)

    return {
        "q_win": randn(B, H, T, D), "q_sink": randn(B, H, T, D),
        "k_new": randn(B, Hkv, T, D), "v_new": randn(B, Hkv, T, D),
        "sink_k": randn(Hkv, plan.S, D), "sink_v": randn(Hkv, plan.S, D),
        "ring_k": randn(B, Hkv, plan.L, D), "ring_v": randn(B, Hkv, plan.L, D),
        "slots": torch.randperm(B, device=DEVICE),
        "head": torch.randint(0, plan.L, (B,), device=DEVICE),
        "fill": torch.full((B,), plan.L, device=DEVICE),
    }  # fmt: skip


def run_kernels(report: Report, plan: Plan, dtype: torch.dtype, budget: Budget) -> None:
    with section(report, "kernels", budget.seconds) as entry:
        from logstream.engine.kernels.sink_ring_attention import (
            _pick_splits,  # Triton: a failure fails this section
        )

        peak = report.data.get("env", {}).get("peak_gbs")
        copy = report.data.get("env", {}).get("copy_gbs")
        report.text(f"decode attention, T = 1, full rings, L = {plan.L}, S = {plan.S}, {dtype}; "
                    f"spec peak {fmt(peak)} GB/s, measured copy {fmt(copy)} GB/s\n")  # fmt: skip
        es = torch.tensor([], dtype=dtype).element_size()
        for D, H, Hkv in plan.kernel_heads:
            for B in plan.kernel_streams:
                if budget.left() < 5:
                    skip(entry, f"D={D} B={B}", f"section budget spent ({budget.seconds:.0f} s)")
                    continue
                x = cache_inputs(B, D, H, Hkv, plan, dtype)
                chunk_len = torch.ones(B, dtype=torch.long, device=DEVICE)
                moved = attention_bytes(B, D, H, Hkv, 1, plan, es)
                row: dict[str, Any] = {
                    "D": D,
                    "H/Hkv": f"{H}/{Hkv}",
                    "streams": B,
                    "ring": str(dtype).removeprefix("torch."),
                    "MB": moved / 1e6,
                }
                row["splits"] = _pick_splits(B * Hkv, plan.L, DEVICE)  # decode: one row block per kv head
                got, _ = sink_ring_attention(**x)
                attn_ms = time_ms(lambda x=x: sink_ring_attention(**x))
                write = [x[k] for k in ("ring_k", "ring_v", "slots", "head", "k_new", "v_new")]
                write_ms = time_ms(lambda w=write, n=chunk_len: ring_write(*w, n))
                row.update(attn_us=attn_ms * 1e3, write_us=write_ms * 1e3)
                row["GB/s"] = moved / (attn_ms * 1e-3) / 1e9
                row["% peak"] = 100 * row["GB/s"] / peak if peak else None
                row["% copy"] = 100 * row["GB/s"] / copy if copy else None
                if plan.reference_max_streams >= B:
                    with torch_reference(True):
                        want, _ = sink_ring_attention(**x)
                        row["reference_us"] = time_ms(lambda x=x: sink_ring_attention(**x)) * 1e3
                    row["rel_err"] = norm_rel_err(got, want)
                entry["rows"].append(row)
                if max(plan.kernel_streams) == B:  # the same rings quantized: the int8 ring's decode
                    entry["rows"].append(int8_kernel_row(x, row, plan, es, peak, copy))
                report.save()  # a run killed mid-section keeps its rows
                del x, write, got
        cols = ["D", "H/Hkv", "streams", "ring", "splits", "attn_us", "MB", "GB/s", "% peak", "% copy", "write_us", "reference_us", "rel_err"]  # fmt: skip
        report.table(entry["rows"], cols)


def int8_kernel_row(
    x: dict[str, torch.Tensor],
    row: dict[str, Any],
    plan: Plan,
    es: int,
    peak: float | None,
    copy: float | None,
) -> dict[str, Any]:
    """`row`'s decode over its rings quantized to int8 with their scales (the engine's `int8_ring`):
    time, bytes moved (1 a value, 4 a key's scale) and error against the 16-bit kernel on the
    dequantized rings, which is what the int8 ring should compute."""
    (k8, k_scale), (v8, v_scale) = reference.quantize_int8(x["ring_k"]), reference.quantize_int8(x["ring_v"])
    quantized = {**x, "ring_k": k8, "ring_v": v8}
    scales = (k_scale, v_scale)
    dequantized = {
        **x, "ring_k": reference.dequantize_int8(k8, k_scale, x["q_win"].dtype),
        "ring_v": reference.dequantize_int8(v8, v_scale, x["q_win"].dtype),
    }  # fmt: skip
    want, _ = sink_ring_attention(**dequantized)
    got, _ = sink_ring_attention(**quantized, ring_scales=scales)
    ms = time_ms(lambda: sink_ring_attention(**quantized, ring_scales=scales))
    keys = x["ring_k"].numel() // x["ring_k"].shape[-1]  # B x Hkv x L
    moved = row["MB"] * 1e6 - 2 * x["ring_k"].numel() * (es - 1) + 2 * keys * 4
    out = {k: row[k] for k in ("D", "H/Hkv", "streams", "splits")}
    out.update(ring="int8", attn_us=ms * 1e3, MB=moved / 1e6, rel_err=norm_rel_err(got, want))
    out["GB/s"] = moved / (ms * 1e-3) / 1e9
    out["% peak"] = 100 * out["GB/s"] / peak if peak else None
    out["% copy"] = 100 * out["GB/s"] / copy if copy else None
    return out


def attention_bytes(B: int, D: int, H: int, Hkv: int, T: int, plan: Plan, element_size: int) -> int:
    """Bytes the attention must move: the full rings, sinks, q_win and q_sink, the chunk's K/V, out;
    lse in fp32. No RoPE tables: keys are stored rotated."""
    moved = element_size * (
        2 * B * Hkv * plan.L * D + 2 * Hkv * plan.S * D + 3 * B * H * T * D + 2 * B * Hkv * T * D
    )
    return moved + 4 * B * H * T


def run_tune(report: Report, plan: Plan, dtype: torch.dtype, budget: Budget) -> None:
    """The attention kernel at `tune_streams` full rings under each (key block, warps, stages)."""
    with section(report, "tune", budget.seconds) as entry:
        from logstream.engine.kernels import (
            sink_ring_attention as kernel,  # Triton: a failure fails this section
        )

        peak = report.data.get("env", {}).get("peak_gbs")
        B, es = plan.tune_streams, torch.tensor([], dtype=dtype).element_size()
        report.text(f"attention at {B} streams, full rings, L = {plan.L}, S = {plan.S}, {dtype}, one "
                    "split; each (key block, warps, stages) against the wrapper's own choice\n")  # fmt: skip
        for D, H, Hkv, T in plan.tune_shapes:
            x = cache_inputs(B, D, H, Hkv, plan, dtype, T)
            moved = attention_bytes(B, D, H, Hkv, T, plan, es)
            want, _ = kernel.sink_ring_attention(**x, num_splits=1)
            for launch in (None, *plan.tune_launches):
                name = f"D={D} T={T} {launch or 'default'}"
                if budget.left() < 5:
                    skip(entry, name, f"section budget spent ({budget.seconds:.0f} s)")
                    continue
                try:
                    got, _ = kernel.sink_ring_attention(**x, num_splits=1, launch=launch)
                    ms = time_ms(
                        lambda x=x, launch=launch: kernel.sink_ring_attention(
                            **x, num_splits=1, launch=launch
                        )
                    )
                except Exception as e:  # a launch that does not compile is a row, not the section
                    skip(entry, name, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                gbs = moved / (ms * 1e-3) / 1e9
                entry["rows"].append({
                    "D": D, "H/Hkv": f"{H}/{Hkv}", "T": T, "launch": "default" if launch is None else "/".join(map(str, launch)),
                    "us": ms * 1e3, "GB/s": gbs, "% peak": 100 * gbs / peak if peak else None,
                    "rel_err": norm_rel_err(got, want),
                })  # fmt: skip
                report.save()
            del x, want
        cols = ["D", "H/Hkv", "T", "launch", "us", "GB/s", "% peak", "rel_err"]
        report.table(sorted(entry["rows"], key=lambda r: (r["D"], r["T"], -r["GB/s"])), cols)


# -- graph: one decode step, eager vs captured ------------------------------------------------------


@dataclass
class StepCache:
    """Per-stream cache state for `decode_step`, all on the device: [B] int64, previous [B, V]."""

    slots: torch.Tensor
    position: torch.Tensor  # tokens the stream has written: head = position mod L, fill = min(position, L)
    chunk_len: torch.Tensor
    previous: torch.Tensor  # log-probs that predict each stream's first token


def decode_step(engine: StreamingEngine, tokens: torch.Tensor, cache: StepCache) -> torch.Tensor:
    """tokens [B, T] -> token NLLs [B, T] fp32, attending over sinks + ring + chunk, writing the ring.

    `StreamingEngine.device_step` (tensors only, no host sync on the Triton path, so it can be
    captured in a CUDA graph) over the fixed-shape bucket ring_len = L - 1; `engine.score` is
    that step plus host bookkeeping, and `step_matches_engine` checks the two agree.
    """
    c = cache
    nll, _ = engine.device_step(tokens, c.previous, c.slots, c.position, c.chunk_len, engine.window - 1)
    return nll


def step_matches_engine(model: torch.nn.Module, plan: Plan, dtype: torch.dtype) -> float:
    """Max relative error between decode_step's token NLLs and engine.score's on the same line.

    The streams first score 1.5 windows of lines, so the ring has wrapped.
    """
    B, T, L = plan.check_streams, plan.line_tokens, plan.check_window
    engine = StreamingEngine(model, list(range(1, plan.S + 1)), window=L, max_streams=B, device=DEVICE, dtype=dtype)  # fmt: skip
    vocab = engine.vocab_size
    engine.score(random_lines(vocab, B, math.ceil(1.5 * L / T), T, seed=2))
    names = [f"s{b}" for b in range(B)]
    slots = [engine.streams[s].slot for s in names]
    cache = StepCache(
        torch.tensor(slots, device=DEVICE),
        torch.tensor(engine.position[slots], device=DEVICE),
        torch.full((B,), T, device=DEVICE),
        engine.next_logprobs[slots],  # [B, V]
    )
    tokens = torch.randint(3, vocab, (B, T), device=DEVICE)
    rings = engine.ring_k.clone(), engine.ring_v.clone()
    got = decode_step(engine, tokens, cache)  # [B, T]
    engine.ring_k.copy_(rings[0])  # undo its ring write: the engine scores the same tokens next
    engine.ring_v.copy_(rings[1])
    out = engine.score({s: [tokens[b].tolist()] for b, s in enumerate(names)})
    want = torch.stack([torch.from_numpy(out[s][0]) for s in names])
    return rel_err(got.cpu(), want)


def full_ring_engine(model: torch.nn.Module, B: int, plan: Plan, dtype: torch.dtype) -> tuple[StreamingEngine, StepCache]:  # fmt: skip
    """An engine whose B rings are full of random keys/values (never time on zeros)."""
    engine = StreamingEngine(model, list(range(1, plan.S + 1)), window=plan.L, max_streams=B, device=DEVICE, dtype=dtype)  # fmt: skip
    engine.ring_k.normal_()
    engine.ring_v.normal_()
    cache = StepCache(  # positions L..2L-1: every ring full, heads random
        torch.arange(B, device=DEVICE), torch.randint(plan.L, 2 * plan.L, (B,), device=DEVICE),
        torch.zeros(B, dtype=torch.long, device=DEVICE), engine.initial_logprobs.expand(B, -1),
    )  # fmt: skip
    return engine, cache


def run_graph(report: Report, plan: Plan, dtype: torch.dtype, budget: Budget) -> None:
    with section(report, "graph", budget.seconds) as entry:
        report.text(
            f"one step of B streams x T tokens over full rings, L = {plan.L}, S = {plan.S}, {dtype}\n"
        )
        checked: dict[str, float] = {}
        entry["step_matches_engine"] = checked
        for preset, B, T in plan.graph_rows:
            row_name = f"{preset} B={B} T={T}"
            if budget.left() < 8:
                skip(entry, row_name, f"section budget spent ({budget.seconds:.0f} s)")
                continue
            model = random_model(preset)
            if preset not in checked:
                checked[preset] = step_matches_engine(model, plan, dtype)
                report.text(f"decode_step vs engine.score, {preset}: max rel err {checked[preset]:.2e}")
                if checked[preset] > (FP32_RTOL if dtype == torch.float32 else BF16_TOLERANCE["token_rtol"]):
                    entry["status"] = "failed"
                    skip(
                        entry, row_name, "decode_step disagrees with engine.score: its timings would mislead"
                    )
                    continue
            engine, cache = full_ring_engine(model, B, plan, dtype)
            cache.chunk_len.fill_(T)
            tokens = torch.randint(3, engine.vocab_size, (B, T), device=DEVICE)
            step = functools.partial(decode_step, engine, tokens, cache)
            row: dict[str, Any] = {"preset": preset, "streams": B, "T": T}
            row["eager_us"] = time_ms(step) * 1e3
            if on_cuda():
                graph, static_out = capture(step)
                eager_out = step()
                before = torch.cuda.memory_stats()["allocation.all.allocated"]
                graph.replay()
                sync()
                row["replay_allocs"] = torch.cuda.memory_stats()["allocation.all.allocated"] - before
                row["graph_vs_eager_abs"] = float((static_out - eager_out).abs().max())
                row["graph_us"] = time_ms(graph.replay) * 1e3
                row["speedup"] = row["eager_us"] / row["graph_us"]
                del graph, static_out, eager_out
            else:
                skip(entry, f"{row_name} capture", "CUDA graphs need a GPU")
            best_us = row.get("graph_us") or row["eager_us"]
            row["tokens/s"] = B * T / (best_us * 1e-6)
            row["lines/s"] = row["tokens/s"] / plan.line_tokens if plan.line_tokens == T else None
            entry["rows"].append(row)
            report.save()
            del engine, cache, tokens, step, model
            if on_cuda():
                torch.cuda.empty_cache()
        cols = ["preset", "streams", "T", "eager_us", "graph_us", "speedup", "replay_allocs", "graph_vs_eager_abs", "tokens/s", "lines/s"]  # fmt: skip
        report.table(entry["rows"], cols)


# -- engine: StreamingEngine.score end to end -------------------------------------------------------


def fits(need: int) -> tuple[bool, str]:
    if not on_cuda():
        return True, ""
    free, _ = torch.cuda.mem_get_info(DEVICE)
    return need < 0.8 * free, f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"


def engine_row(preset: str, B: int, path: str, plan: Plan, dtype: torch.dtype) -> dict[str, Any]:
    """lines/s and tokens/s of engine.score with one line per stream per call, rings full."""
    T, p = plan.line_tokens, PRESETS[preset]
    model = random_model(preset).to(DEVICE, dtype)
    row: dict[str, Any] = {"preset": preset, "streams": B, "path": path}
    if path == "dense":  # HF's forward over sinks + the last L tokens, recomputed for each line
        ids = torch.randint(3, p.vocab_size, (B, plan.S + plan.L), device=DEVICE)
        with torch.no_grad():
            ms = time_ms(lambda: model(ids, logits_to_keep=T + 1).logits)
        row["lines/s"] = B / (ms * 1e-3)
        row["tokens/s"] = row["lines/s"] * T
        return row
    # Fill in chunks whose fp32 log-prob temporaries ([B, chunk, V], about 4 copies) stay < 8 GiB.
    chunk = max(T, min(256, (8 << 30) // (16 * B * p.vocab_size) // T * T))
    sync()
    base = torch.cuda.memory_allocated(DEVICE) if on_cuda() else 0
    with torch_reference(path == "reference"):
        engine = StreamingEngine(
            model, list(range(1, plan.S + 1)), window=plan.L, max_streams=B, chunk_tokens=chunk,
            device=DEVICE, dtype=dtype, int8_ring=path == "int8",
        )  # fmt: skip
        if on_cuda():
            row["measured_bytes_per_stream"] = (torch.cuda.memory_allocated(DEVICE) - base) / B
        if path == "graphs":  # padded to buckets and replayed; on the CPU rehearsal padded only
            engine.step_fn = BucketedStep(engine, capture=on_cuda())
        engine.score(random_lines(p.vocab_size, B, math.ceil(plan.L / T) + 1, T, seed=3))  # fill, compile
        batches = [random_lines(p.vocab_size, B, 1, T, seed=10 + i) for i in range(plan.steps + 2)]
        for batch in batches[:2]:  # warm: the steady-state shapes
            engine.score(batch)
        if on_cuda():
            torch.cuda.reset_peak_memory_stats(DEVICE)
        start = time.perf_counter()
        for batch in batches[2:]:
            engine.score(batch)  # returns host numpy: synchronizes
        seconds = time.perf_counter() - start
    row["lines/s"] = B * plan.steps / seconds
    row["tokens/s"] = row["lines/s"] * T
    row["ms/call"] = 1e3 * seconds / plan.steps
    row["bytes_per_stream"] = engine.bytes_per_stream
    if on_cuda():
        row["peak_bytes_per_stream"] = (torch.cuda.max_memory_allocated(DEVICE) - base) / B
    assert engine.bytes_per_stream == kv_bytes_per_stream(preset, plan.L, dtype, path == "int8"), (
        "KV bytes formula"
    )
    return row


def run_engine(report: Report, plan: Plan, dtype: torch.dtype, budget: Budget) -> None:
    with section(report, "engine", budget.seconds) as entry:
        report.text(f"engine.score, one {plan.line_tokens}-token line per stream per call, full rings, "
                    f"L = {plan.L}, S = {plan.S}, {dtype}, {plan.steps} timed calls\n")  # fmt: skip
        for preset, B, path in plan.engine_rows:
            row_name = f"{preset} B={B} {path}"
            need = B * kv_bytes_per_stream(preset, plan.L, dtype, path == "int8") + (10 << 30) * (B >= 1024)
            ok, why = fits(need)
            if not ok:
                skip(entry, row_name, why)
                continue
            # A row at B streams costs about 2 s per 1,024 streams on a GPU (host bookkeeping dominates).
            if budget.left() < 5 + 2 * B / 1024:
                skip(entry, row_name, f"section budget: {budget.left():.0f} s left")
                continue
            try:
                entry["rows"].append(engine_row(preset, B, path, plan, dtype))
                report.save()
            except torch.cuda.OutOfMemoryError as e:
                skip(entry, row_name, f"out of memory: {str(e).splitlines()[0]}")
            if on_cuda():
                torch.cuda.empty_cache()
        entry["rows"].sort(key=lambda r: (r["preset"], r["path"], r["streams"]))
        cols = ["preset", "path", "streams", "lines/s", "tokens/s", "ms/call", "bytes_per_stream", "measured_bytes_per_stream", "peak_bytes_per_stream"]  # fmt: skip
        report.table(entry["rows"], cols)
        for preset in dict.fromkeys(r[0] for r in plan.engine_rows):
            report.text(f"KV bytes per stream, {preset}: layers x 2 x L x kv_heads x head_dim x dtype size = "
                        f"{kv_bytes_per_stream(preset, plan.L, dtype):,} B")  # fmt: skip


# -- goals: the targets, each with its measured figure --------------------------------------------------


def goals(report: Report) -> list[dict[str, Any]]:
    sections = report.data["sections"]

    def rows(name: str) -> list[dict[str, Any]]:
        return sections.get(name, {}).get("rows", [])

    out = []
    attn = [
        r
        for r in rows("kernels")
        if r["streams"] >= 1024 and r.get("% peak") is not None and r["ring"] != "int8"
    ]
    best = max((r["% peak"] for r in attn), default=None)
    out.append({"goal": "fused attention >= 70% of HBM peak at 1,024 streams", "measured": best,
                "met": None if best is None else best >= 70})  # fmt: skip
    small = [r["lines/s"] for r in rows("engine") if r["preset"] == "small" and r["path"] in ("triton", "graphs") and r["streams"] >= 1024]  # fmt: skip
    best = max(small, default=None)
    out.append({"goal": "small preset >= 1M lines/s over >= 1,024 streams (engine.score)",
                "measured": best, "met": None if best is None else best >= 1e6})  # fmt: skip
    device_only = [r["lines/s"] for r in rows("graph") if r["preset"] == "small" and r.get("lines/s")]
    out.append({"goal": "(bound) small preset device-only step, captured, lines/s at 1,024 streams",
                "measured": max(device_only, default=None), "met": None})  # fmt: skip
    tuned = [r["% peak"] for r in rows("tune") if r["T"] == 1 and r.get("% peak") is not None]
    out.append({"goal": "(tune) best launch, decode at 1,024 streams, % of HBM peak",
                "measured": max(tuned, default=None), "met": None})  # fmt: skip
    speedups = [r["speedup"] for r in rows("graph") if r.get("speedup") and r["streams"] <= 64]
    best = min(speedups, default=None)  # the worst small-batch row must still make it
    out.append({"goal": "CUDA graph >= 2x faster than eager at small batch (worst of B <= 64)",
                "measured": best, "met": None if best is None else best >= 2})  # fmt: skip
    for r in rows("correct"):
        out.append({"goal": f"engine scores vs CPU reference, {r['dtype']}: {r['tolerance']}",
                    "measured": r["token_max_rel_err"], "met": r["pass"]})  # fmt: skip
    return out


def write_summary(report: Report, started: float) -> None:
    report.data["goals"] = goals(report)
    report.data["total_seconds"] = round(time.perf_counter() - started, 1)
    env = report.data.get("env", {})
    lines = [f"logstream GPU check on {env.get('gpu', 'CPU (rehearsal)')}: torch {env.get('torch')}, "
             f"triton {env.get('triton')}, {report.data['total_seconds']} s"]  # fmt: skip
    for name, entry in report.data["sections"].items():
        lines.append(f"section {name}: {entry['status']} in {entry['seconds']} s"
                     + (f" ({entry['error']})" if "error" in entry else "")
                     + (f", {len(entry['skipped'])} rows skipped" if entry["skipped"] else ""))  # fmt: skip
    for g in report.data["goals"]:
        met = {True: "MET", False: "MISSED", None: "n/a"}[g["met"]]
        lines.append(f"[{met}] {g['goal']}: {fmt(g['measured'])}")
    report.text("\n## summary\n")
    for line in lines:
        report.text(line)
    (report.out / "summary.txt").write_text("\n".join(lines) + "\n")
    report.save()


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    parser.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {SECTIONS}")
    parser.add_argument("--budget-s", type=float, default=300, help="hard cap on the whole run")
    parser.add_argument("--peak-gbs", type=float, help="HBM peak to compare with (GB/s)")
    args = parser.parse_args()
    if args.rehearse and any(os.environ.get(k) != v for k, v in INTERPRET_ENV.items()):
        # Triton reads TRITON_INTERPRET when a kernel module is first imported: start over with it set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **INTERPRET_ENV})
    if not args.rehearse and not torch.cuda.is_available():
        parser.error("no CUDA GPU found: use --rehearse for the CPU rehearsal")
    wanted = [s for s in args.sections.split(",") if s]
    if unknown := set(wanted) - set(SECTIONS):
        parser.error(f"--sections: unknown {sorted(unknown)}; expected some of {SECTIONS}")
    DEVICE = torch.device("cpu" if args.rehearse else "cuda")
    plan_name = "rehearse" if args.rehearse else "full"
    plan, dtype = PLANS[plan_name], getattr(torch, args.dtype)
    report = Report(args.out, plan_name)
    started = time.perf_counter()
    overall = Budget(args.budget_s)
    runners = {
        "env": lambda b: run_env(report, plan, args, b),
        "correct": lambda b: run_correct(report, plan, b),
        "kernels": lambda b: run_kernels(report, plan, dtype, b),
        "graph": lambda b: run_graph(report, plan, dtype, b),
        "engine": lambda b: run_engine(report, plan, dtype, b),
        "tune": lambda b: run_tune(report, plan, dtype, b),
    }
    for name in SECTIONS:
        if name not in wanted:
            continue
        seconds = min(plan.budgets_s[name], overall.left())
        if seconds < 5:
            report.data["sections"][name] = {"status": "skipped", "seconds": 0, "rows": [], "skipped": [],
                                             "error": f"run budget spent ({args.budget_s:.0f} s)"}  # fmt: skip
            continue
        runners[name](Budget(seconds))
    write_summary(report, started)
    failed = [name for name, entry in report.data["sections"].items() if entry["status"] == "failed"]
    sys.exit(f"failed sections: {', '.join(failed)}" if failed else 0)


if __name__ == "__main__":
    main()
