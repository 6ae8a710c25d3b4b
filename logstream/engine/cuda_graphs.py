"""CUDA graphs for the engine's step: pad each step to a bucket shape, capture once, replay.

An eager step of a small model is bound by kernel launches: on the H200, one step of `small`
at one stream took 3,352 µs eager and 293 µs replayed from a graph (docs/gpu/README.md). A
graph replays fixed shapes, so `BucketedStep` pads each step: streams to the next power of two,
tokens to the next power of two up to the engine's chunk. A padding row has chunk_len 0 and
position 0 (so fill 0): it reads no ring entry and writes none, so it may name any slot.
Padding tokens come after a row's last real one, and causal attention keeps them out of the
real tokens' view.
One graph per (streams, tokens) bucket, captured on first use, all in one memory pool.

    engine.step_fn = BucketedStep(engine)                 # CUDA: capture, then replay
    engine.step_fn = BucketedStep(engine, capture=False)  # any device: the same padding, eager

The Triton kernels read each stream's fill, not the step's `ring_len` hint, so a graph is
captured with ring_len = L - 1 and serves every fill. (The torch reference path syncs with the
host in its ring write and cannot be captured.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from logstream.engine.streaming import StreamingEngine


def capture(
    fn: Callable[[], object], pool: tuple[int, int] | None = None
) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm fn up on a side stream (Triton compiles, the allocator fills its cache), then
    capture it: (graph, fn's output, whose memory each replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def bucket(n: int) -> int:
    """The least power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # tokens [B, T], previous [B, V], slots, position, chunk_len [B]
    nll: torch.Tensor  # [B, T]
    last: torch.Tensor  # [B, V]


class BucketedStep:
    """`StreamingEngine.device_step`'s signature, over shapes padded to buckets (see module doc)."""

    def __init__(self, engine: StreamingEngine, capture: bool = True) -> None:
        if capture and engine.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the engine on a CUDA device, not {engine.device}")
        self.engine = engine
        self.capture = capture
        self.graphs: dict[tuple[int, int], Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def shape(self, B: int, T: int) -> tuple[int, int]:
        """The bucket of a [B, T] step. T past the engine's chunk (CPU blocks) is not padded."""
        return bucket(B), (bucket(T) if bucket(T) <= self.engine.chunk_tokens else T)

    def __call__(
        self, tokens: torch.Tensor, previous: torch.Tensor, *step: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`device_step(tokens, previous, slots, position, chunk_len, ring_len, fill_all=False)`."""
        slots, position, chunk_len, ring_len, fill_all = (*step, False)[:5]  # fill_all is optional
        B, T = tokens.shape
        Bp, Tp = self.shape(B, T)
        # padding rows are zeros: chunk_len 0 and position 0 (module doc)
        padded = [F.pad(tokens, (0, Tp - T, 0, Bp - B)), F.pad(previous, (0, 0, 0, Bp - B))]
        padded += [F.pad(x, (0, Bp - B)) for x in (slots, position, chunk_len)]
        if not self.capture:
            nll, last = self.engine.device_step(*padded, ring_len, fill_all and Bp == B)
            return nll[:B, :T], last[:B]
        captured = self.graphs.get((Bp, Tp)) or self._capture(Bp, Tp)
        for static, x in zip(captured.inputs, padded, strict=True):
            static.copy_(x)
        captured.graph.replay()
        return captured.nll[:B, :T].clone(), captured.last[:B].clone()  # the next replay rewrites them

    def _capture(self, B: int, T: int) -> Captured:
        """Capture the step at [B, T]. Its inputs start at zero, so the warm-up runs write no ring."""
        engine = self.engine
        zeros = [torch.zeros(B, T, dtype=torch.long, device=engine.device)]
        zeros.append(torch.zeros(B, engine.vocab_size, device=engine.device))
        zeros += [torch.zeros(B, dtype=torch.long, device=engine.device) for _ in range(3)]
        graph, (nll, last) = capture(lambda: engine.device_step(*zeros, engine.window - 1), self.pool)
        self.graphs[B, T] = Captured(graph, zeros, nll, last)
        return self.graphs[B, T]
