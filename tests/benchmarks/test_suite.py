"""`benchmarks/suite.py --quick --json`: the benchmark suite runs end to end and its output has
the documented shape. Numbers are never asserted to be fast or slow (speed goes in docs/benchmarks.md);
only structure and invariants that hold on any machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
METHODS = {"dense_recompute", "window_no_sinks", "window_recompute", "sinks_ring"}
DETECTORS = {
    "sinks_ring (ours)", "sinks_ring small", "drain3_rarity", "drain3_online", "ngram_next_template", "deeplog_lstm",
}  # fmt: skip


def _bench(*args: str, runs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite.py"), *args, "--runs", str(runs)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick run (models trained into a temporary cache), parsed from its last stdout line."""
    runs = tmp_path_factory.mktemp("bench-runs")
    done = _bench("--quick", "--json", runs=runs)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_quick_run_has_every_section(quick: dict[str, Any]) -> None:
    """The JSON on the last line holds all five sections and the time each took."""
    for section in ("table", "constant", "streams", "ablation", "peers"):
        assert section in quick
        assert section in quick["seconds"]
    assert quick["threads"] == 1


def test_table_has_four_methods_at_every_length(quick: dict[str, Any]) -> None:
    """Each method has one row per stream length: measured (ms, perplexity, AUC-PR) or capped with a reason."""
    table = quick["table"]
    lengths = quick["config"]["lengths"]
    assert set(table["methods"]) == METHODS
    for method, rows in table["methods"].items():
        assert [r["lines"] for r in rows] == lengths, method
        for row in rows:
            if row["status"] == "ok":
                assert row["ms_per_line"] > 0 and row["perplexity"] > 1
            else:
                assert method == "dense_recompute" and row["status"].startswith("capped")


def test_ring_memory_does_not_grow_with_the_stream(quick: dict[str, Any]) -> None:
    """Sinks + ring: the KV bytes are the same at every stream length; dense grows with the history."""
    ring = {r["kv_bytes"] for r in quick["table"]["methods"]["sinks_ring"]}
    assert len(ring) == 1
    dense = [r["kv_bytes"] for r in quick["table"]["methods"]["dense_recompute"]]
    assert dense == sorted(dense) and dense[0] < dense[-1]


def test_constant_cost_points_cover_the_stream(quick: dict[str, Any]) -> None:
    """Checkpoints along the stream, each with p50 <= p99, and the stream's cache bytes never change."""
    constant = quick["constant"]
    points = constant["points"]
    assert len(points) == quick["config"]["checkpoints"]
    assert points[-1]["lines"] <= constant["stream_lines"] == quick["config"]["stream_lines"]
    assert all(p["p50_ms"] <= p["p99_ms"] for p in points)
    assert constant["cache_bytes_constant"] is True


def test_many_streams_cache_is_linear_in_streams(quick: dict[str, Any]) -> None:
    """One row per stream count; the cache holds exactly streams x bytes per stream."""
    rows = quick["streams"]["rows"]
    assert [r["streams"] for r in rows] == quick["config"]["stream_counts"]
    for row in rows:
        assert row["cache_bytes"] == row["streams"] * row["bytes_per_stream"]
        assert row["lines_per_second"] > 0


def test_ablation_has_the_four_sink_settings(quick: dict[str, Any]) -> None:
    """S = 0, 1, 4 and the pattern prompt, each with perplexity, AUC-PR and the scores around the roll."""
    modes = quick["ablation"]["modes"]
    assert list(modes)[:3] == ["S=0", "S=1 (BOS)", "S=4"]
    assert list(modes)[3].startswith("patterns")
    for result in modes.values():
        assert result["perplexity"] > 1
        assert result["score_before_roll"] is not None and result["score_after_roll"] is not None


def test_peers_report_f1_and_auc_pr(quick: dict[str, Any]) -> None:
    """On the synthetic incidents (and HDFS when the data is there) every detector has F1 and AUC-PR in [0, 1]."""
    peers = quick["peers"]
    datasets = ["synthetic"] + (["hdfs"] if "skipped" not in peers["hdfs"] else [])
    for dataset in datasets:
        assert set(peers[dataset]) >= DETECTORS
        for detector in DETECTORS:
            result = peers[dataset][detector]
            assert 0 <= result["f1"] <= 1 and 0 <= result["auc_pr"] <= 1


def test_unknown_section_is_an_error_naming_the_sections(tmp_path: Path) -> None:
    """--only with a section that does not exist exits 2, its error line naming the sections."""
    done = _bench("--only", "nope", runs=tmp_path)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "argument --only: invalid choice: 'nope'" in error
    assert all(section in error for section in ("table", "constant", "streams", "ablation", "peers"))
