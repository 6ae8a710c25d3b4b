"""Replay keeps no per-line state: what stays in memory does not grow with the input length.

The peak RSS at 20k and 200k lines is measured in benchmarks/replay_memory.py (docs/benchmarks.md);
this test counts the objects a replay keeps, which is what makes that memory flat."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.records import Anomaly, LogRecord
from logstream.replay import ReplayOptions, Unit, load_replay_input, run_replay
from logstream.report.groups import EXAMPLES


def _live(*types: type) -> int:
    gc.collect()
    return sum(type(o) in types for o in gc.get_objects())


def _replay(model: Path, tmp_path: Path, n: int) -> tuple[int, int, int]:
    """Replay n synthetic lines with incidents; returns (units and anomalies kept, records kept, patterns)."""
    log = tmp_path / f"log-{n}.log"
    lines = generate_lines(n, seed=5, incidents=INCIDENT_KINDS).lines  # n lines plus the incidents'
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / f"scores-{n}.jsonl"
    options = ReplayOptions(input=log, model=model, stream_key=STREAM_KEY, out=out, threshold=1.0)
    before = _live(Unit, Anomaly), _live(LogRecord)
    report = run_replay(options, load_replay_input(options))
    kept = _live(Unit, Anomaly) - before[0], _live(LogRecord) - before[1]
    rows = out.read_text().splitlines()
    assert len(report.columns) == len(rows) == len(lines) and json.loads(rows[-1])["line"] == len(lines)
    assert report.summary()["anomalies"] > len(INCIDENT_KINDS)  # a low threshold: many anomalies
    return kept[0], kept[1], len(report.patterns)


def test_replay_keeps_a_bounded_summary_not_the_lines(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """Ten times the lines keep no more units than the groups' examples (the worst and the
    first EXAMPLES of each pattern and of its anomalies), and no record beyond the line each
    kept unit was scored from: nothing per line."""
    small = _replay(synthetic_model_dir, tmp_path, 400)
    large = _replay(synthetic_model_dir, tmp_path, 4000)
    for units, records, patterns in (small, large):
        assert records <= units
        assert units <= 2 * (1 + EXAMPLES) * patterns
    assert large[0] < 4000 // 10
