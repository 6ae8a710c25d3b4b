"""The GPU check's harness runs end to end on CPU: `benchmarks/gpu.py --rehearse`.

The rehearsal runs every section with tiny shapes, the kernels in Triton's interpreter;
only CUDA timing, graph capture and GPU memory counters are skipped. Its numbers say
nothing about a GPU; what it proves is that the one device run will not die of a
harness bug (docs/gpu/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """bench.json of one rehearsal run (about 40 s on 2 cores)."""
    out = tmp_path_factory.mktemp("gpu-rehearsal")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--rehearse", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (out / "bench.md").is_file() and (out / "summary.txt").is_file()
    return json.loads((out / "bench.json").read_text())


def test_rehearsal_runs_every_section(rehearsal: dict) -> None:
    """Every section ran; the only rows skipped are the CUDA-graph captures."""
    sections = rehearsal["sections"]
    assert list(sections) == ["env", "correct", "kernels", "graph", "engine", "tune"]
    for name, entry in sections.items():
        assert entry["status"] in ("ok", "partial"), (name, entry)
        assert entry["rows"], name
        assert all("CUDA graphs need a GPU" in s["reason"] for s in entry["skipped"]), entry["skipped"]
    assert rehearsal["env"]["interpret"] is True


def test_rehearsal_interpreted_kernels_match_the_reference(rehearsal: dict) -> None:
    """Engine scores through the interpreted kernels pass the fp32 and bf16 tolerances."""
    rows = rehearsal["sections"]["correct"]["rows"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    assert all(r["pass"] for r in rows), rows
    assert rehearsal["sections"]["graph"]["step_matches_engine"]["tiny"] < 1e-3


def test_rehearsal_int8_decode_computes_the_dequantized_ring(rehearsal: dict) -> None:
    """At the most streams each head shape has a second, int8 ring row: fewer bytes moved, and
    the 16-bit kernel's output on the dequantized rings (bf16 in the rehearsal)."""
    rows = rehearsal["sections"]["kernels"]["rows"]
    int8 = [r for r in rows if r["ring"] == "int8"]
    assert [(r["D"], r["streams"]) for r in int8] == [(32, 3)]
    (bf16,) = [r for r in rows if r["ring"] == "bfloat16" and r["streams"] == 3]
    assert int8[0]["MB"] < bf16["MB"] and int8[0]["rel_err"] < 1e-2


def test_rehearsal_engine_rows_report_kv_bytes(rehearsal: dict) -> None:
    """Engine rows cover the Triton, bucketed (graphs), int8 ring, reference and dense paths; KV
    bytes match the formula."""
    rows = rehearsal["sections"]["engine"]["rows"]
    assert {r["path"] for r in rows} == {"triton", "graphs", "int8", "reference", "dense"}
    # tiny preset, L = 64, bf16: 2 layers x 2 x 64 x 2 kv heads x 16 x 2 bytes; int8: x (16 + 4) bytes
    assert {r["bytes_per_stream"] for r in rows if r["path"] not in ("dense", "int8")} == {
        2 * 2 * 64 * 2 * 16 * 2
    }
    assert {r["bytes_per_stream"] for r in rows if r["path"] == "int8"} == {2 * 2 * 64 * 2 * (16 + 4)}
    assert all(r["lines/s"] > 0 for r in rows)


def test_rehearsal_tune_launches_compute_what_the_default_does(rehearsal: dict) -> None:
    """Each (key block, warps, stages) the tune section times gives the default launch's output."""
    rows = rehearsal["sections"]["tune"]["rows"]
    assert [r["launch"] for r in rows] == ["default", "32/4/2", "64/4/3"]
    assert all(r["rel_err"] < 1e-2 for r in rows), rows
