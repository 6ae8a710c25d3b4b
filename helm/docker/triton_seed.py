"""Triton in an image without a C compiler (helm/docker/Dockerfile.cuda).

Triton compiles one C module, its CUDA driver glue (`cuda_utils`, from driver.c), with the
system C compiler when the first kernel runs. The runtime image has no compiler, so the
build stage compiles that module into a seed cache (`python -m triton_seed seed`, linked
against a stub libcuda.so.1: the real one comes with the NVIDIA container toolkit when the
pod runs), and the runtime looks there first (TRITON_CACHE_MANAGER=
triton_seed:SeededCacheManager). Kernels compiled at run time go to TRITON_CACHE_DIR as usual.

Triton finds a module by a key over driver.c, the include and library folders (so
TRITON_LIBCUDA_PATH must be the same in both stages) and the platform: a seed made by
another Triton is simply not found. `python -m triton_seed check`, run with no compiler
reachable, fails unless the runtime finds the seed.
"""

from __future__ import annotations

import os
import sys

from triton.backends.nvidia import driver
from triton.runtime import build
from triton.runtime.cache import FileCacheManager

SEED_DIR = os.environ.get("TRITON_SEED_DIR", "/opt/triton-seed")


class SeededCacheManager(FileCacheManager):
    """Triton's file cache (TRITON_CACHE_DIR), with the read-only seed looked up first."""

    def get_file(self, filename: str) -> str | None:
        seeded = os.path.join(SEED_DIR, self.key, filename)
        return seeded if os.path.isfile(seeded) else super().get_file(filename)


def driver_module() -> str:
    """The compiled driver module's path, looked up as Triton's CudaUtils does (compiled,
    into the cache, if it is not found)."""
    source = os.path.join(driver.dirname, "driver.c")
    return build.compile_so_from_file(
        source, "cuda_utils", driver.library_dirs(), driver.include_dirs, driver.libraries
    )


def main(command: str) -> int:
    """`seed`: compile the driver module into TRITON_CACHE_DIR (the build stage points it at
    SEED_DIR). `check`: the module is found in SEED_DIR without compiling."""
    path = driver_module()
    if command == "check" and not path.startswith(os.path.join(SEED_DIR, "")):
        print(f"triton_seed: the driver module came from {path}, not the seed {SEED_DIR}", file=sys.stderr)
        return 1
    print(f"triton_seed: {command}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "check"))
