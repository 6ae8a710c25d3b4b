"""Pick the implementation: Triton for CUDA tensors, torch's flash attention on CPU (flash_cpu.py).

`LOGSTREAM_FORCE_TRITON=1` sends CPU tensors to the Triton kernels too; with
`TRITON_INTERPRET=1` set before Triton is first imported, they run in Triton's
interpreter (how CI tests the kernels without a GPU). `LOGSTREAM_FORCE_REFERENCE=1`
sends CUDA and CPU tensors to the torch reference (an escape hatch, and the benchmarks'
baseline). The switches are read on every call, so a process can compare paths. Triton is imported only when
a kernel is first used, so CPU-only installs never load it.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from logstream.engine.kernels import flash_cpu, reference

Backend = Literal["triton", "flash_cpu", "reference"]
FORCE_TRITON_ENV = "LOGSTREAM_FORCE_TRITON"
FORCE_REFERENCE_ENV = "LOGSTREAM_FORCE_REFERENCE"


def backend_for(x: torch.Tensor) -> Backend:
    """The implementation a call with tensors on x's device takes."""
    if os.environ.get(FORCE_REFERENCE_ENV) == "1":
        return "reference"
    if x.is_cuda or os.environ.get(FORCE_TRITON_ENV) == "1":
        return "triton"
    return "flash_cpu" if x.device.type == "cpu" else "reference"


def ring_write(
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    chunk_len: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Scatter the chunk's K/V into ring slots (head + i) mod L, in place (reference.py).
    `scales` (k, v) [N, Hkv, L, 1] fp32: the ring is int8, each token quantized
    (`reference.quantize_int8`) and its scales written at the same slots."""
    if backend_for(ring_k) == "triton":  # flash_cpu has no ring write of its own: the reference's
        from logstream.engine.kernels import ring_write as kernel

        kernel.ring_write(ring_k, ring_v, slots, head, k_new, v_new, chunk_len, scales)
    elif scales is None:
        reference.ring_write(ring_k, ring_v, slots, head, k_new, v_new, chunk_len)
    else:
        (k8, k_scale), (v8, v_scale) = reference.quantize_int8(k_new), reference.quantize_int8(v_new)
        reference.ring_write(ring_k, ring_v, slots, head, k8, v8, chunk_len)
        reference.ring_write(*scales, slots, head, k_scale, v_scale, chunk_len)


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
    ring_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over sinks + ring + chunk: (out [B, H, T, D], lse [B, H, T] fp32).
    Keys and queries come rotated (reference.py): no backend applies RoPE.

    `ring_len` and `bias` are hints for flash_cpu (its bound on the ring entries any query sees
    and its window mask, computed once per step for all layers); the Triton kernel reads each
    stream's filled slots anyway, and the reference all L. `block`: flash_cpu only, which
    alone takes chunks longer than the ring (T > L), in blocks of that many queries.
    `ring_scales` (k, v) [N, Hkv, L, 1] fp32: the ring is int8. The Triton kernel dequantizes
    it as it reads; the others first dequantize the batch's rings (`reference.dequantize_int8`).
    """
    backend = backend_for(q_win)
    assert backend == "flash_cpu" or block is None or q_win.shape[2] <= block, f"{backend}: one block a step"
    if ring_scales is not None and backend != "triton":  # [B, Hkv, L, D] each, at slots 0..B-1
        ring_k = reference.dequantize_int8(ring_k[slots], ring_scales[0][slots], q_win.dtype)
        ring_v = reference.dequantize_int8(ring_v[slots], ring_scales[1][slots], q_win.dtype)
        slots = torch.arange(len(slots), device=slots.device)
    args = (q_win, q_sink, k_new, v_new, sink_k, sink_v, ring_k, ring_v, slots, head, fill)
    if backend == "triton":
        from logstream.engine.kernels import sink_ring_attention as kernel

        return kernel.sink_ring_attention(*args, ring_scales=ring_scales)
    if backend == "flash_cpu":
        return flash_cpu.sink_ring_attention(*args, ring_len=ring_len, bias=bias, block=block)
    return reference.sink_ring_attention(*args)
