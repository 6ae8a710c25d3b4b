"""Benchmarks under test: a script of benchmarks/ imported as a module (the folder is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `logstream_bench_<name>`. The folder goes on the end of
    sys.path, so that a script's imports of its neighbours (`from roofline import ...`) resolve
    as when it runs, and never shadow an installed package."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"logstream_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
