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

from logstream.kernels import flash_cpu, reference

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
) -> None:
    """Scatter the chunk's K/V into ring slots (head + i) mod L, in place (reference.py)."""
    if backend_for(ring_k) == "triton":  # flash_cpu has no ring write of its own: the reference's
        from logstream.kernels import ring_write as kernel

        kernel.ring_write(ring_k, ring_v, slots, head, k_new, v_new, chunk_len)
    else:
        reference.ring_write(ring_k, ring_v, slots, head, k_new, v_new, chunk_len)


def sink_ring_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    sink_k: torch.Tensor,
    sink_v: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    slots: torch.Tensor,
    head: torch.Tensor,
    fill: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    ring_len: int | None = None,
    bias: torch.Tensor | None = None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over sinks + ring + chunk: (out [B, H, T, D], lse [B, H, T] fp32).

    `ring_len` and `bias` are hints for flash_cpu (its bound on the ring entries any query sees
    and its window mask, computed once per step for all layers); the Triton kernel reads each
    stream's filled slots anyway, and the reference all L. `block`: flash_cpu only, which
    alone takes chunks longer than the ring (T > L), in blocks of that many queries.
    """
    args = (q, k_new, v_new, sink_k, sink_v, ring_k, ring_v, slots, head, fill, cos, sin)
    backend = backend_for(q)
    assert backend == "flash_cpu" or block is None or q.shape[2] <= block, f"{backend}: one block a step"
    if backend == "triton":
        from logstream.kernels import sink_ring_attention as kernel

        return kernel.sink_ring_attention(*args)
    if backend == "flash_cpu":
        return flash_cpu.sink_ring_attention(*args, ring_len=ring_len, bias=bias, block=block)
    return reference.sink_ring_attention(*args)
