"""The CPU step's memory (logstream/engine/allocator.py): step-sized blocks come from glibc's heap
and stay there, instead of being mapped and unmapped every step."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Run in a fresh interpreter: a long-lived one (the test session) may hold a free 16 MiB chunk
# in its heap already, which glibc would hand out whatever the thresholds.
HEAP_CHECK = """
import ctypes, ctypes.util
from logstream.engine import allocator

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2: ten size_t counters
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p

def mapped_while_holding(size):
    block = libc.malloc(size)
    try:
        return libc.mallinfo2().hblks
    finally:
        libc.free(ctypes.c_void_p(block))

idle = libc.mallinfo2().hblks
assert libc.mallopt(allocator.M_MMAP_THRESHOLD, 128 << 10)  # glibc's starting threshold, held
before = mapped_while_holding(16 << 20) - idle
set_ = allocator.keep_step_memory()
after = mapped_while_holding(16 << 20) - idle
print(before, set_, after, libc.mallinfo2().arena >= 16 << 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_cpu_step_sized_blocks_come_from_the_heap_and_stay() -> None:
    """Under glibc's starting mmap threshold a 16 MiB block is mapped afresh; after
    `keep_step_memory` it comes from the heap, and the heap keeps its pages once it is freed
    (allocator.py)."""
    run = subprocess.run([sys.executable, "-c", HEAP_CHECK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "True", "0", "True"]
