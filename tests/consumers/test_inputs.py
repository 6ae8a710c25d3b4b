"""Reading backtest inputs: sessions and lines, with bad input counted rather than fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logstream.consumers.inputs import (
    InputError,
    InputStats,
    compile_stream_key,
    line_parser,
    parse_lines,
    read_lines,
    read_records,
    read_sessions,
)
from logstream.consumers.parse import RecordParser, Rejected, RejectLog
from logstream.evaluation.synth import STREAM_KEY
from logstream.settings import InputSettings

MAX_MESSAGE_BYTES = InputSettings().max_message_bytes


def test_long_session_record_is_read_whole(tmp_path: Path) -> None:
    """A session whose JSON record is longer than one log line may be is still one session;
    only its log lines over max_message_bytes are skipped (and counted), as serve skips them."""
    lines = [f"line {i} " + "x" * 40 for i in range(300)] + ["y" * (MAX_MESSAGE_BYTES + 1)]
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"session": "big", "lines": lines, "label": 1}) + "\n{not json}\n")
    stats = InputStats()
    (session,) = read_sessions(path, stats)
    assert session.id == "big" and session.label == 1 and session.lines == lines[:300]
    assert stats.as_dict() == {"oversized": 1, "bad_session_json": 1}


def test_lines_are_judged_as_serve_judges_them(tmp_path: Path) -> None:
    """Blank lines, invalid UTF-8 and lines over max_message_bytes are rejects of serve's kinds,
    counted and skipped; a long line under the limit is kept whole."""
    path = tmp_path / "x.log"
    long = b"z" * 10_000
    path.write_bytes(b"a\n\n  \nb \xff\n" + b"y" * (MAX_MESSAGE_BYTES + 1) + b"\n" + long + b"\n")
    stats = InputStats()
    assert read_lines(path, stats) == ["a", long.decode()]
    assert stats.as_dict() == {"empty": 2, "undecodable": 1, "oversized": 1}


def test_replay_reads_a_file_as_serve_parses_its_messages(tmp_path: Path) -> None:
    """The same raw lines, each parsed as serve parses a Kafka message (plain format, regex
    stream key), give the records replay reads: the same lines, streams and rejects."""
    raw = [b"web-1 GET /a 200", b"", b"worker-2 job \xfe started", b"monitor-3 cpu=4%", b"x" * 70_000]
    path = tmp_path / "x.log"
    path.write_bytes(b"\n".join(raw) + b"\n")
    stats = InputStats()
    replayed = list(read_records(path, stats, line_parser(STREAM_KEY)))
    serve = RecordParser(InputSettings(format="plain", stream_key="regex", stream_regex=STREAM_KEY))
    rejects = RejectLog()
    served = []
    for value in raw:
        parsed = serve.parse(value)
        if isinstance(parsed, Rejected):
            rejects.add(parsed)
        else:
            served.append(parsed)
    assert [(r.line, r.stream) for r in replayed] == [(r.line, r.stream) for r in served]
    assert [r.stream for r in replayed] == ["web-1", "monitor-3"]
    assert stats.as_dict() == {kind: n for kind, n in rejects.counts.items() if n}


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


@pytest.mark.parametrize("at", [0, 1_000, 2_000])
def test_a_nul_byte_is_a_bad_line_wherever_it_is(tmp_path: Path, at: int) -> None:
    """A line holding a NUL byte is counted as `binary` and skipped, on the first line as in
    the middle or at the end: the rest of the file is scored (no file-level refusal)."""
    lines = [b"ok line %d" % i for i in range(2_001)]
    lines[at] = b"bad \x00 line"
    path = tmp_path / "x.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    stats = InputStats()
    kept = read_lines(path, stats)
    assert len(kept) == 2_000 and "bad \x00 line" not in kept
    assert stats.as_dict() == {"binary": 1}


def test_nul_byte_in_a_session_record_is_counted_and_skipped(tmp_path: Path) -> None:
    """A session record holding a raw NUL byte past the first 8 KB is no JSON: bad_session_json."""
    path = tmp_path / "s.jsonl"
    good = json.dumps({"session": "a", "lines": ["x" * 100]}) + "\n"
    path.write_bytes(good.encode() * 100 + b'{"session": "b", "lines": ["\x00"]}\n')
    stats = InputStats()
    assert len(read_sessions(path, stats)) == 100
    assert stats.as_dict() == {"bad_session_json": 1}


def test_stream_key_runs_on_re2_and_refuses_backreferences() -> None:
    """--stream-key `(a+)+$` cannot hang on a backtracking line (RE2); a backreference is an InputError."""
    records = parse_lines(["a" * 46 + "!", "x aaa"], r"(a+)+$")
    assert [r.stream for r in records] == ["default", "aaa"]
    with pytest.raises(InputError, match="--stream-key"):
        compile_stream_key(r"(a)\1")
