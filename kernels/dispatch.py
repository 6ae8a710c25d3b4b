"""Pick the implementation: Triton for CUDA tensors, the torch reference on CPU."""

from __future__ import annotations

from logstream.kernels.reference import ring_write, sink_ring_attention

__all__ = ["ring_write", "sink_ring_attention"]
