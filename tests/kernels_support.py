"""Kernel test support: random cache inputs, and a worker running Triton's interpreter.

Why the interpreter runs in a child process: Triton reads `TRITON_INTERPRET` when a kernel is
decorated (its module's first import) and again while it runs. Setting it in
the pytest process would turn every Triton kernel imported later, the real
GPU tests' included, into interpreted ones, and unsetting it mid-run breaks
kernels already decorated. So the interpreted tests hand their inputs to one
long-lived `spawn`ed worker whose environment has `TRITON_INTERPRET=1` and
`LOGSTREAM_FORCE_TRITON=1` from its first line, and compare what comes back
with the reference computed in the pytest process.

Inputs and results cross as pickles; torch moves CPU tensors it pickles into
shared memory, so compute the reference on your own copies *before* a call
whose kernel writes in place, and read results from the return value.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any

import torch

INTERPRET_ENV = {"TRITON_INTERPRET": "1", "LOGSTREAM_FORCE_TRITON": "1"}


def _init_worker() -> None:
    os.environ.update(INTERPRET_ENV)


def _call(target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


class Interpreter:
    """One worker process; `call("pkg.module:function", *args)` runs it there."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._pool = ctx.Pool(processes=1, initializer=_init_worker)

    def call(self, target: str, *args: Any, timeout: float = 300.0, **kwargs: Any) -> Any:
        return self._pool.apply_async(_call, (target, args, kwargs)).get(timeout=timeout)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


@dataclass(frozen=True)
class Case:
    B: int = 3
    H: int = 4
    Hkv: int = 2
    T: int = 1
    D: int = 16
    S: int = 4
    L: int = 37  # not a power of two
    dtype: torch.dtype = torch.float32
    seed: int = 0


def make_inputs(
    c: Case, fill: list[int] | None = None, head: list[int] | None = None, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Random K/V and queries, a pool with more slots than streams. Keys and queries stand for
    rotated ones (the kernels apply no RoPE, reference.py), so any values do."""
    g = torch.Generator().manual_seed(c.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(c.dtype)

    N = c.B + 2
    inputs = {
        "q_win": randn(c.B, c.H, c.T, c.D),
        "q_sink": randn(c.B, c.H, c.T, c.D),
        "k_new": randn(c.B, c.Hkv, c.T, c.D),
        "v_new": randn(c.B, c.Hkv, c.T, c.D),
        "sink_k": randn(c.Hkv, c.S, c.D),
        "sink_v": randn(c.Hkv, c.S, c.D),
        "ring_k": randn(N, c.Hkv, c.L, c.D),
        "ring_v": randn(N, c.Hkv, c.L, c.D),
        "slots": torch.randperm(N, generator=g)[: c.B],
        "head": torch.tensor(head) if head else torch.randint(0, c.L, (c.B,), generator=g),
        "fill": torch.tensor(fill) if fill else torch.randint(0, c.L + 1, (c.B,), generator=g),
    }
    return {name: x.to(device) for name, x in inputs.items()}
