"""Reading backtest inputs: sessions and lines, with bad input counted rather than fatal."""

from __future__ import annotations

import json
from pathlib import Path

from logstream.inputs import InputStats, read_lines, read_sessions
from logstream.normalize import MAX_LINE_CHARS


def test_long_session_record_is_read_whole(tmp_path: Path) -> None:
    """A session whose JSON record is longer than one log line may be is still one session;
    only its overlong log lines are cut (and counted)."""
    lines = [f"line {i} " + "x" * 40 for i in range(300)] + ["y" * (MAX_LINE_CHARS + 10)]
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"session": "big", "lines": lines, "label": 1}) + "\n{not json}\n")
    stats = InputStats()
    (session,) = read_sessions(path, stats)
    assert session.id == "big" and session.label == 1 and len(session.lines) == 301
    assert len(session.lines[-1]) == MAX_LINE_CHARS
    assert stats.as_dict() == {"oversized_line": 1, "bad_session_json": 1}


def test_lines_skip_empty_and_repair_bad_bytes(tmp_path: Path) -> None:
    """Empty lines are counted and skipped; invalid UTF-8 is decoded with replacement and counted."""
    path = tmp_path / "x.log"
    path.write_bytes(b"a\n\n  \nb \xff\n")
    stats = InputStats()
    assert read_lines(path, stats) == ["a", "b \ufffd"]
    assert stats.as_dict() == {"empty_line": 2, "invalid_utf8": 1}
