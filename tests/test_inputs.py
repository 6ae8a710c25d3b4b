"""Reading backtest inputs: sessions and lines, with bad input counted rather than fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logstream.inputs import InputError, InputStats, compile_stream_key, read_lines, read_sessions, stream_of
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


def test_session_with_impossible_label_is_counted_and_skipped(tmp_path: Path) -> None:
    """`label: 1e400` (infinity) or 2 is a bad session, not an OverflowError traceback."""
    path = tmp_path / "s.jsonl"
    path.write_text(
        '{"session": "a", "lines": ["x"], "label": 1e400}\n'
        '{"session": "b", "lines": ["x"], "label": 2}\n'
        '{"session": "c", "lines": ["x"], "label": "1"}\n'
    )
    stats = InputStats()
    (session,) = read_sessions(path, stats)
    assert (session.id, session.label) == ("c", 1)
    assert stats.as_dict() == {"bad_session_json": 2}


def test_deeply_nested_session_json_is_counted_and_skipped(tmp_path: Path) -> None:
    """JSON nested past the recursion limit (a RecursionError in json) is a bad session."""
    path = tmp_path / "s.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    lines_deep = '{"session": "d", "lines": [' + "[" * 900 + "]" * 900 + "]}"
    path.write_text(f'{deep}\n{lines_deep}\n{{"session": "ok", "lines": ["x"]}}\n')
    stats = InputStats()
    (session,) = read_sessions(path, stats)
    assert session.id == "ok"
    assert stats.as_dict() == {"bad_session_json": 2}


def test_nul_byte_after_the_first_8_kb_is_counted_and_its_line_skipped(tmp_path: Path) -> None:
    """A NUL byte past the binary sniff (first 8 KB) skips just its line, counted as nul_byte."""
    path = tmp_path / "x.log"
    path.write_bytes(b"ok line\n" * 2_000 + b"bad \x00 line\n" + b"last\n")
    stats = InputStats()
    lines = read_lines(path, stats)
    assert len(lines) == 2_001 and lines[-1] == "last"
    assert stats.as_dict() == {"nul_byte": 1}


def test_nul_byte_in_a_session_record_is_counted_and_skipped(tmp_path: Path) -> None:
    """A session line holding a raw NUL byte past the first 8 KB is skipped as nul_byte."""
    path = tmp_path / "s.jsonl"
    good = json.dumps({"session": "a", "lines": ["x" * 100]}) + "\n"
    path.write_bytes(good.encode() * 100 + b'{"session": "b", "lines": ["\x00"]}\n')
    stats = InputStats()
    assert len(read_sessions(path, stats)) == 100
    assert stats.as_dict() == {"nul_byte": 1}


def test_stream_key_runs_on_re2_and_refuses_backreferences() -> None:
    """--stream-key `(a+)+$` cannot hang on a backtracking line (RE2); a backreference is an InputError."""
    key = compile_stream_key(r"(a+)+$")
    assert stream_of("a" * 46 + "!", key) == "default"
    assert stream_of("x aaa", key) == "aaa"
    with pytest.raises(InputError, match="--stream-key"):
        compile_stream_key(r"(a)\1")
