"""This machine's ceilings, measured with torch: sustained GEMM FLOP/s (fp32, bf16) and memory bandwidth.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/roofline.py [--seconds 1.0]

Every speed benchmark divides its achieved FLOP/s and bytes/s by these (`measure()`), in the
same run, so a ratio survives the load of a shared machine better than an absolute figure.
Each of them samples the ceilings again between its repetitions and divides by the highest of
each (`highest`): on the shared 2-core VM the fp32 GEMM read 150 to 325 GFLOP/s within minutes,
and a neighbour's load only ever slows a sample, so one sample at the start can halve the
ceiling and double every share (docs/benchmarks.md, "The roofline, sampled through the run").

- GEMM: a square matmul C = A @ B, n = 2048 (2 n^3 FLOPs per call), repeated for `seconds`;
  the best of 3 repetitions. fp32, and bf16 (on AVX-512 BF16 / AMX cores oneDNN runs it natively).
- Bandwidth: `dst.copy_(src)` of 256 MiB fp32 (twice the L2 + L3 of small machines), counting the
  bytes read plus the bytes written; best of 3.

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

GEMM_N = 2048  # 3-5% above n = 1024 on the 2-core VM: closer to the ceiling
COPY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Roofline:
    fp32_flops: float  # FLOP/s, sustained square GEMM
    bf16_flops: float
    bytes_per_second: float  # memory copy, read + write
    threads: int
    load_average: float  # 1-minute load average while measuring (a shared machine); `highest`: the most seen

    def fraction(
        self, flops: float, bytes_moved: float, dtype: torch.dtype = torch.float32
    ) -> dict[str, float]:
        """Achieved rates as shares of the ceilings: {'flops_share', 'bytes_share'}."""
        peak = self.bf16_flops if dtype == torch.bfloat16 else self.fp32_flops
        return {"flops_share": flops / peak, "bytes_share": bytes_moved / self.bytes_per_second}


def best_rate(fn: Callable[[], object], work: float, seconds: float) -> float:
    """work / seconds per call of fn, best of 3 runs of about `seconds / 3` each."""
    fn()  # warm-up: oneDNN picks its kernel, pages are touched
    best = 0.0
    for _ in range(3):
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds / 3 or calls == 0:
            fn()
            calls += 1
        best = max(best, work * calls / elapsed)
    return best


def gemm_flops(dtype: torch.dtype, seconds: float, n: int = GEMM_N) -> float:
    """Sustained FLOP/s of an n x n x n matmul in `dtype` (2 n^3 FLOPs per call)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    return best_rate(lambda: torch.mm(a, b, out=out), 2.0 * n**3, seconds)


def copy_bandwidth(seconds: float, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a large fp32 copy, read + write."""
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    return best_rate(lambda: dst.copy_(src), 2.0 * nbytes, seconds)


def measure(seconds: float = 1.0) -> Roofline:
    """The three ceilings at torch's current thread count."""
    return Roofline(
        fp32_flops=gemm_flops(torch.float32, seconds),
        bf16_flops=gemm_flops(torch.bfloat16, seconds),
        bytes_per_second=copy_bandwidth(seconds),
        threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],
    )


def highest(samples: Sequence[Roofline]) -> Roofline:
    """The ceilings of several samples taken through one run: the highest of each. Noise on a
    shared machine only slows a sample, so the highest is the closest to what the machine can do,
    and it is a best of several runs as each lever's time is."""
    return Roofline(
        fp32_flops=max(s.fp32_flops for s in samples),
        bf16_flops=max(s.bf16_flops for s in samples),
        bytes_per_second=max(s.bytes_per_second for s in samples),
        threads=samples[0].threads,
        load_average=max(s.load_average for s in samples),
    )


def engine_flops_per_token(config: object, sinks: int, window: int) -> float:
    """FLOPs of one scored token in the streaming engine, from a HF Llama config.

    2 x (the matmuls' multiply-adds) + 4 x layers x H x D x (S + W): per layer q, k, v, o
    (C x H D + 2 C x Hkv D + H D x C), the SwiGLU MLP (3 C x I) and once the LM head (C x V);
    attention is q.k and p.v (2 D multiply-adds) per head for each of the S + W keys a query
    sees, W = its window (min(fill + 1, L)). Norms, RoPE, softmax are left out (O(C), O(H D W)
    non-matmul work). See docs/benchmarks.md for the numbers per preset and ring fill.
    """
    c = config
    C, H, Hkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads  # type: ignore[attr-defined]
    D = getattr(c, "head_dim", None) or C // H
    layers, inter, vocab = c.num_hidden_layers, c.intermediate_size, c.vocab_size  # type: ignore[attr-defined]
    macs = layers * (C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * inter) + C * vocab
    return 2.0 * macs + 4.0 * layers * H * D * (sinks + window)


def engine_bytes_per_step(config: object, streams: int, ring_len: int, element_size: int) -> float:
    """Bytes one engine step must read at least: every stream's live ring K/V in every layer
    (layers x 2 x R x Hkv x D x bytes each) plus the weights once."""
    c = config
    H, Hkv = c.num_attention_heads, c.num_key_value_heads  # type: ignore[attr-defined]
    D = getattr(c, "head_dim", None) or c.hidden_size // H  # type: ignore[attr-defined]
    ring = streams * c.num_hidden_layers * 2 * ring_len * Hkv * D * element_size  # type: ignore[attr-defined]
    C, inter = c.hidden_size, c.intermediate_size  # type: ignore[attr-defined]
    weights = c.num_hidden_layers * (2 * C * H * D + 2 * C * Hkv * D + 3 * C * inter) + C * c.vocab_size  # type: ignore[attr-defined]
    return float(ring + weights * element_size)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement (3 repetitions)")
    args = parser.parse_args()
    roof = measure(args.seconds)
    print(
        f"fp32 GEMM {roof.fp32_flops / 1e9:.1f} GFLOP/s, bf16 GEMM {roof.bf16_flops / 1e9:.1f} GFLOP/s, "
        f"copy {roof.bytes_per_second / 1e9:.1f} GB/s, {roof.threads} threads, load {roof.load_average:.2f}"
    )
    print(json.dumps(asdict(roof)))


if __name__ == "__main__":
    main()
