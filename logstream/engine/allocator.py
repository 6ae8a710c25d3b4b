"""glibc's malloc, set for the CPU engine's steps.

A CPU step allocates and frees tensors of 0.1-30 MB (the logits, the MLP's activations, the
window's keys). glibc serves a block above its mmap threshold with fresh pages from the kernel,
each faulted in on first touch, and returns them when the block is freed. It starts that
threshold at 128 KiB and raises it only as such blocks are freed, and it trims the heap's top
whenever more than its trim threshold lies free there. Fixing both at the values its own
adjustment tops out at on 64-bit (32 MiB, and twice that) keeps a step's tensors in the heap,
their pages reused from step to step: tiny's step at L = 128 took 18-20% less time, small's at
L = 2048 0-3%, and the peak RSS hardly moved (docs/benchmarks.md, "glibc's malloc thresholds").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


@functools.cache
def keep_step_memory() -> bool:
    """Fix glibc's mmap and trim thresholds, once per process; False where libc has no mallopt
    (macOS) or refuses them."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
