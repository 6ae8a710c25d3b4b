"""Shared pieces of the feedback tests: another process holding the database
(benchmarks/faults.py, which the chaos run injects too)."""

from __future__ import annotations

from benchmarks_support import load_benchmark

locked = load_benchmark("faults").locked
