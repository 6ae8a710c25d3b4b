"""Raw message -> LogRecord: formats, stream keys, and every kind of bad input."""

from __future__ import annotations

import json

import pytest

from logstream.consumers.parse import RecordParser, Rejected, RejectLog
from logstream.records import LogRecord
from logstream.settings import InputSettings


def _parse(value: bytes | None, key: bytes | None = None, **settings: object) -> LogRecord | Rejected:
    return RecordParser(InputSettings(**settings)).parse(value, key=key, source="t/0", offset=7)


def test_plain_line_keeps_source_and_offset() -> None:
    """A plain message becomes its line, with source and offset; trailing newline dropped."""
    record = _parse(b"INFO ok\r\n", key=b"web-1")
    assert record == LogRecord("INFO ok", stream="web-1", source="t/0", offset=7)


def test_inner_line_breaks_become_spaces() -> None:
    """A multi-line message stays one line (the model reads a newline as a line end)."""
    assert _parse(b"ERROR boom\n  at x\n  at y").line == "ERROR boom   at x   at y"


def test_json_message_field_by_dotted_path() -> None:
    """format json reads the line from a nested field, as log shippers send it."""
    value = json.dumps({"log": {"message": "WARN disk 91%"}, "host": "db-1"}).encode()
    record = _parse(value, format="json", message_field="log.message")
    assert record.line == "WARN disk 91%"


def test_stream_from_json_field() -> None:
    """stream_key json_field takes the stream from a JSON field."""
    value = json.dumps({"message": "x", "kubernetes": {"pod": "api-7"}}).encode()
    record = _parse(value, format="json", stream_key="json_field", stream_field="kubernetes.pod")
    assert record.stream == "api-7"


def test_stream_from_regex_group_or_whole_match() -> None:
    """stream_key regex takes group 1 when the regex has one, else the whole match."""
    line = b"081109 203615 INFO dfs.DataNode: Receiving block blk_-1608999687919862906 src"
    assert _parse(line, stream_key="regex", stream_regex=r"blk_-?\d+").stream == "blk_-1608999687919862906"
    assert _parse(line, stream_key="regex", stream_regex=r"blk_(-?\d+)").stream == "-1608999687919862906"


@pytest.mark.parametrize(
    ("settings", "value", "key"),
    [
        ({"stream_key": "message_key"}, b"line", None),
        ({"stream_key": "regex", "stream_regex": r"host=(\w+)"}, b"no host here", None),
        (
            {"format": "json", "stream_key": "json_field", "stream_field": "h"},
            b'{"message": "x"}',
            None,
        ),
        ({"stream_key": "none"}, b"line", b"ignored-key"),
    ],
)
def test_stream_falls_back_to_default(settings: dict, value: bytes, key: bytes | None) -> None:
    """No key / no match / no field (or stream_key none): the default stream, not an error."""
    assert _parse(value, key=key, default_stream="all", **settings).stream == "all"


@pytest.mark.parametrize(
    ("value", "settings", "kind"),
    [
        (b"\xff\xfe bad bytes", {}, "undecodable"),
        (b"core \x00\x01 dump", {}, "binary"),
        (b'{"message": "a \\u0000 b"}', {"format": "json"}, "binary"),  # a NUL once decoded too
        (b"x" * 65, {"max_message_bytes": 64}, "oversized"),
        (b"{not json", {"format": "json"}, "bad_json"),
        (b"[1, 2]", {"format": "json"}, "bad_json"),
        (b'{"msg": "x"}', {"format": "json"}, "missing_field"),
        (b'{"message": 5}', {"format": "json"}, "missing_field"),
        (b"", {}, "empty"),
        (None, {}, "empty"),
        (b"  \n", {}, "empty"),
        (b'{"message": "  "}', {"format": "json"}, "empty"),
        # nested past the recursion limit (60 KB, under max_message_bytes): RecursionError
        (b"[" * 30_000 + b"]" * 30_000, {"format": "json"}, "bad_json"),
        (b'{"message": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", {"format": "json"}, "bad_json"),
        # an integer past sys.get_int_max_str_digits(): ValueError, not JSONDecodeError
        (b'{"message": "x", "n": ' + b"7" * 5_000 + b"}", {"format": "json"}, "bad_json"),
    ],
)
def test_bad_input_is_rejected_with_its_kind(value: bytes | None, settings: dict, kind: str) -> None:
    """Bad input is a Rejected of the right kind, never an exception."""
    rejected = _parse(value, **settings)
    assert isinstance(rejected, Rejected)
    assert rejected.kind == kind


def test_reject_log_counts_every_one_and_logs_first_of_each_kind(
    capsys: pytest.CaptureFixture,
) -> None:
    """RejectLog counts all rejects but logs only the first of each kind."""
    rejects = RejectLog()
    for _ in range(3):
        rejects.add(Rejected("bad_json", "x"))
    rejects.add(Rejected("empty", "y"))
    assert rejects.counts["bad_json"] == 3
    assert rejects.counts["empty"] == 1
    logged = capsys.readouterr().out + capsys.readouterr().err
    assert logged.count("bad_record_skipped") == 2


def test_parse_never_raises_on_an_unexpected_error() -> None:
    """An error no branch foresaw (here a non-bytes value) is an `unparsable` reject, not a raise."""
    rejected = RecordParser(InputSettings()).parse("not bytes")  # type: ignore[arg-type]
    assert isinstance(rejected, Rejected)
    assert rejected.kind == "unparsable"


def test_lone_surrogates_from_json_escapes_become_encodable_text() -> None:
    """JSON `\\ud800` escapes (lone surrogates) in line or stream are replaced: SQLite and RE2 need UTF-8."""
    value = b'{"message": "a \\ud800 b", "h": "web-\\udc00"}'
    record = _parse(value, format="json", stream_key="json_field", stream_field="h")
    assert record.line == "a ? b"
    assert record.stream == "web-?"
    record.line.encode("utf-8")  # must not raise


def test_non_scalar_json_stream_field_falls_back_to_default() -> None:
    """A JSON object or list at stream_field is no stream name: the default stream."""
    value = json.dumps({"message": "x", "h": {"deep": [1, 2]}}).encode()
    assert _parse(value, format="json", stream_key="json_field", stream_field="h").stream == "default"


def test_backtracking_stream_regex_runs_in_linear_time() -> None:
    """`(a+)+$` on 47 bytes that make Python's `re` backtrack for ever is matched by RE2.

    No timing assertion: with `re` this call does not return for hours; with RE2 it returns.
    """
    record = _parse(b"a" * 46 + b"!", stream_key="regex", stream_regex=r"(a+)+$", default_stream="d")
    assert record.stream == "d"
    record = _parse(b"x aaa", stream_key="regex", stream_regex=r"(a+)+$")
    assert record.stream == "aaa"


def test_reject_log_counts_kinds_it_has_not_seen() -> None:
    """Every reject kind is counted, including kinds RejectLog does not list."""
    rejects = RejectLog()
    rejects.add(Rejected("unparsable", "x"))
    rejects.add(Rejected("unparsable", "y"))
    assert rejects.counts["unparsable"] == 2
