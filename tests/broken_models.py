"""Model directories damaged the ways a store version gets damaged: a copy of a real model
directory with one fault in its files (benchmarks/faults.py, which the chaos run injects too)."""

from __future__ import annotations

from benchmarks_support import load_benchmark

_faults = load_benchmark("faults")
BREAKAGES = _faults.BREAKAGES
broken_copy = _faults.broken_copy
