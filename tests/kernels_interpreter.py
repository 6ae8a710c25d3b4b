"""Run functions under Triton's interpreter in a child process (for the kernel tests).

Why a child process: Triton reads `TRITON_INTERPRET` when a kernel is
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
from typing import Any

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
