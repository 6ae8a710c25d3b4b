"""Property-based fuzzing of everything untrusted input reaches first.

The record parser, the normalizer and level parser, the line tokenizer and the
sessions reader get arbitrary bytes, text and JSON structures. Each may only
return its documented result (a LogRecord or a Rejected; a string; token ids;
sessions or an InputError), never raise anything else.

Bounded and deterministic for CI: a fixed number of examples, derandomized
(the same examples on every run), and no deadline (a loaded 2-core runner
must not turn slowness into a failure).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstream.consumers.inputs import InputError, InputStats, read_lines, read_sessions
from logstream.consumers.parse import REJECT_KINDS, RecordParser, Rejected
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.evaluation.synth import generate_lines
from logstream.records import LogRecord
from logstream.settings import InputSettings
from logstream.text.normalize import LEVELS, Normalizer, parse_level

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)
# Records that look like what shippers send, with any value in the fields serve reads.
JSON_RECORDS = st.fixed_dictionaries(
    {},
    optional={"message": JSON_VALUES | st.text(), "host": JSON_VALUES, "log": JSON_VALUES},
)
NESTED_BRACKETS = st.builds(
    lambda opening, closing, depth, extra: opening * depth + closing * (depth + extra),
    st.sampled_from([b"[", b"{", b'{"message":', b'{"a":[']),
    st.sampled_from([b"]", b"}", b""]),
    st.integers(0, 40_000),
    st.integers(-2, 2),
)

PARSERS = [
    RecordParser(InputSettings()),
    RecordParser(InputSettings(stream_key="regex", stream_regex=r"((?:web|worker)-\d+)|(a+)+$")),
    RecordParser(InputSettings(format="json", message_field="log.message", max_message_bytes=100_000)),
    RecordParser(
        InputSettings(format="json", stream_key="json_field", stream_field="host", max_message_bytes=100_000)
    ),
]


def _check(result: LogRecord | Rejected) -> None:
    """The parser's contract: a usable record (one encodable line, a stream) or a known reject."""
    if isinstance(result, Rejected):
        assert result.kind in REJECT_KINDS
        return
    assert isinstance(result, LogRecord)
    assert result.line.strip() and "\n" not in result.line
    assert result.stream
    result.line.encode("utf-8")  # SQLite, RE2 and the tokenizer all need valid UTF-8
    result.stream.encode("utf-8")


@pytest.mark.parametrize("parser", PARSERS, ids=["plain", "regex", "json", "json-field"])
@FUZZ
@given(value=st.binary(max_size=2_000) | st.none(), key=st.binary(max_size=50) | st.none())
def test_parser_never_raises_on_arbitrary_bytes(parser: RecordParser, value: bytes, key: bytes) -> None:
    """Any bytes, with any message key, become a LogRecord or a Rejected."""
    _check(parser.parse(value, key=key, source="t/0", offset=0))


@pytest.mark.parametrize("parser", PARSERS, ids=["plain", "regex", "json", "json-field"])
@FUZZ
@given(record=JSON_RECORDS | JSON_VALUES)
def test_parser_never_raises_on_arbitrary_json(parser: RecordParser, record: object) -> None:
    """Any JSON structure (NaN and Infinity included) becomes a LogRecord or a Rejected."""
    _check(parser.parse(json.dumps(record).encode(), key=b"k"))


@FUZZ
@given(value=NESTED_BRACKETS)
def test_parser_never_raises_on_deep_nesting(value: bytes) -> None:
    """JSON nested up to 40,000 deep (past the recursion limit) is a reject or a record, never a raise."""
    _check(PARSERS[2].parse(value))


@FUZZ
@given(line=st.text(max_size=5_000))
def test_normalizer_masks_any_text(line: str) -> None:
    """Normalizer.mask returns one line of text for any text."""
    masked = Normalizer().mask(line)
    assert isinstance(masked, str)
    assert "\n" not in masked


@FUZZ
@given(line=st.text(max_size=5_000))
def test_parse_level_reads_any_text(line: str) -> None:
    """parse_level returns one of the known levels or None for any text."""
    assert parse_level(line) in {*LEVELS.values(), None}


@pytest.fixture(scope="module")
def tokenizer() -> LineTokenizer:
    """A tiny BPE tokenizer trained once on a few hundred synthetic lines."""
    normalizer = Normalizer()
    lines = [normalizer.mask(line) for line in generate_lines(400, seed=5).lines]
    return LineTokenizer(train_tokenizer(lines, vocab_size=300), max_line_tokens=64)


@FUZZ
@given(lines=st.lists(st.text(max_size=300), max_size=8))
def test_tokenizer_encodes_any_text(tokenizer: LineTokenizer, lines: list[str]) -> None:
    """encode_lines gives every line 1..max_line_tokens ids, all inside the vocabulary."""
    encoded = tokenizer.encode_lines(lines)
    assert len(encoded) == len(lines)
    for ids in encoded:
        assert 1 <= len(ids) <= tokenizer.max_line_tokens
        assert all(0 <= i < tokenizer.vocab_size for i in ids)


@pytest.fixture(scope="module")
def scratch_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file, rewritten by each example."""
    return tmp_path_factory.mktemp("fuzz-inputs") / "input.txt"


def _read_sessions_or_input_error(path: Path) -> None:
    stats = InputStats()
    try:
        sessions = read_sessions(path, stats)
    except InputError:
        return
    for session in sessions:
        assert session.label in (None, 0, 1)
        assert all(isinstance(line, str) for line in session.lines)
        "".join(session.lines).encode("utf-8")  # the tokenizer needs valid UTF-8


@FUZZ
@given(data=st.binary(max_size=3_000))
def test_read_sessions_survives_arbitrary_bytes(scratch_path: Path, data: bytes) -> None:
    """Any file content gives sessions (bad records counted) or one InputError."""
    scratch_path.write_bytes(data)
    _read_sessions_or_input_error(scratch_path)


@FUZZ
@given(data=st.binary(max_size=12_000))
def test_read_lines_survives_arbitrary_bytes(scratch_path: Path, data: bytes) -> None:
    """Any log file gives NUL-free UTF-8 lines (bad ones counted) or one InputError."""
    scratch_path.write_bytes(data)
    try:
        lines = read_lines(scratch_path, InputStats())
    except InputError:
        return
    for line in lines:
        assert "\x00" not in line
        line.encode("utf-8")


SESSION_RECORDS = st.fixed_dictionaries(
    {}, optional={"session": JSON_VALUES, "lines": JSON_VALUES | st.lists(st.text()), "label": JSON_VALUES}
)


@FUZZ
@given(records=st.lists(SESSION_RECORDS | JSON_VALUES, max_size=5), deep=st.integers(0, 3_000))
def test_read_sessions_survives_arbitrary_json(scratch_path: Path, records: list[object], deep: int) -> None:
    """Any JSON records (and one nested `deep` levels) give sessions or one InputError."""
    text = "".join(json.dumps(r) + "\n" for r in records) + "[" * deep + "]" * deep + "\n"
    scratch_path.write_text(text, encoding="utf-8")
    _read_sessions_or_input_error(scratch_path)
