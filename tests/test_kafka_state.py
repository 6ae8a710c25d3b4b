"""State that follows its partition (logstream/kafka_state.py), in process: the record format,
the engine's rebuild from token ids, the restore of a stream into another detector, the
cold-start policy, split streams, and re-delivered lines a restored state already covers.
The real-broker tests (a rebalance, a kill -9) are in tests/test_kafka_state_broker.py."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_support import tiny_llama
from serve_support import ODD_LINE, RESTORE_TOLERANCE

from logstream.detector import Detector
from logstream.engine.streaming import StreamingEngine
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.kafka_state import BadRecord, StreamBook, StreamState, restorable
from logstream.metrics import CHANGELOG_RESTORE_FAILURES, SPLIT_STREAMS
from logstream.records import LogRecord
from logstream.settings import StateSettings


def records(lines: list[str], source: str = "logs/0", first_offset: int = 0) -> list[LogRecord]:
    """Synthetic lines as Kafka records of their host's stream, at consecutive offsets."""
    out = []
    for i, line in enumerate(lines):
        host = re.search(STREAM_KEY, line)
        stream = host.group(1) if host else "default"
        out.append(LogRecord(line, stream, source, first_offset + i, source_kind="kafka"))
    return out


def test_state_record_round_trips_in_uint16_and_int32() -> None:
    """A state decodes to what was encoded; token ids past uint16 switch the record to int32."""
    for tokens, size in (([1, 2, 65_535], 2), ([1, 70_000], 4)):
        state = StreamState("web-1", "model@abc", "logs/3", 17, 42, 1.5, tokens, ["a <*>"])
        value = state.encode()
        assert StreamState.decode("web-1", value) == state
        assert value.endswith(
            torch.tensor(tokens).numpy().astype(f"<{'u2' if size == 2 else 'i4'}").tobytes()
        )


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"{}",
        b"LSC1\x05\x00\x00\x00{bad}",
        b"not a changelog record at all",
        b'LSC1\x0d\x00\x00\x00{"dtype":"O"}',  # only uint16/int32 token ids
    ],
)
def test_foreign_record_is_refused_with_a_reason(value: bytes) -> None:
    """A value that is not a logstream state (another writer, a torn record) raises ValueError."""
    with pytest.raises(ValueError, match="changelog record"):
        StreamState.decode("s", value)


def test_engine_rebuild_from_tokens_scores_as_if_never_left() -> None:
    """A stream rebuilt from its token ids (history within the window) scores its next lines
    as the engine that kept it does; streams beyond max_streams are parked, not re-encoded."""
    model = tiny_llama(2)
    history, after = [[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[14, 15], [16, 17, 18]]
    kept = StreamingEngine(model, [1], window=32, max_streams=2, chunk_tokens=8, device="cpu")
    kept.score({"a": history})
    moved = StreamingEngine(model, [1], window=32, max_streams=2, chunk_tokens=8, device="cpu")
    moved.rebuild({"x": [3, 4], "y": [4, 5], "a": kept.tokens("a")})  # least recent first
    assert list(moved.streams) == ["y", "a"] and list(moved.evicted) == ["x"]
    want, got = kept.score({"a": after})["a"], moved.score({"a": after})["a"]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(w), atol=1e-4, rtol=1e-4)


def test_restored_stream_scores_like_one_that_never_moved(synthetic_model_dir: Path) -> None:
    """Streams written by one detector and restored into another find their next lines as
    surprising as the detector that kept them does (within RESTORE_TOLERANCE), and a cold one
    does not."""
    lines = records(generate_lines(400, seed=5).lines)
    before, after = lines[:300], lines[300:]
    kept = Detector.load(synthetic_model_dir)
    kept.score(before)
    want = kept.score(after)
    first, book = Detector.load(synthetic_model_dir), StreamBook(StateSettings(), 1000)
    book.observe(first.score(before))
    states, _ = book.take_changes(first)
    moved, restore_book = Detector.load(synthetic_model_dir), StreamBook(StateSettings(), 1000)
    decoded = sorted((StreamState.decode(s.stream, s.encode()) for s in states), key=lambda s: s.seen)
    assert restore_book.restore(moved, decoded) == len({r.stream for r in before})
    got = moved.score(after)
    cold = Detector.load(synthetic_model_dir).score(after)
    assert max(abs(g.surprisal - w.surprisal) for g, w in zip(got, want, strict=True)) <= RESTORE_TOLERANCE
    assert max(abs(c.surprisal - w.surprisal) for c, w in zip(cold, want, strict=True)) > RESTORE_TOLERANCE


def test_cold_start_holds_alerts_back_until_min_context_lines(synthetic_model_dir: Path) -> None:
    """With min_context_lines N, an odd line among a stream's first N raises no alert (it is
    still scored), the same line later does; cold_threshold alerts above it only. A line of
    the critical level alerts even cold: its alert does not rest on the stream's context."""
    detector = Detector.load(synthetic_model_dir)
    fatal = LogRecord(ODD_LINE, "web-2", "logs/0", 0, source_kind="kafka")
    [critical] = StreamBook(StateSettings(min_context_lines=3), 1000).observe(detector.score([fatal]))
    assert critical.level == "critical" and critical.is_anomaly
    odd = LogRecord(
        ODD_LINE.replace("FATAL kernel: panic", "INFO kernel:"), "web-1", "logs/0", 0, source_kind="kafka"
    )
    book = StreamBook(StateSettings(min_context_lines=3), 1000)
    [first] = book.observe(detector.score([odd]))
    assert first.score > detector.threshold and not first.is_anomaly
    normal = records(generate_lines(40, seed=3).lines)
    book.observe(detector.score([r for r in normal if r.stream == "web-1"][:2]))
    [later] = book.observe(detector.score([odd]))
    assert later.is_anomaly
    strict = StreamBook(StateSettings(min_context_lines=3, cold_threshold=first.score + 1), 1000)
    [held] = strict.observe(detector.score([odd]))
    assert not held.is_anomaly and held.threshold == first.score + 1
    lenient = StreamBook(StateSettings(min_context_lines=3, cold_threshold=first.score - 1), 1000)
    [raised] = lenient.observe(detector.score([odd]))
    assert raised.is_anomaly


def test_stream_on_two_partitions_is_counted_once(synthetic_model_dir: Path) -> None:
    """A stream whose lines come from two partitions is counted once as split."""
    detector = Detector.load(synthetic_model_dir)
    book = StreamBook(StateSettings(), 1000)
    lines = generate_lines(30, seed=4).lines
    split_before = SPLIT_STREAMS._value.get()
    for partition in (0, 1, 0, 1):
        book.observe(detector.score(records(lines[:5], source=f"logs/{partition}")))
    assert SPLIT_STREAMS._value.get() - split_before == len({r.stream for r in records(lines[:5])})


def test_redelivered_lines_covered_by_a_restored_state_are_skipped(synthetic_model_dir: Path) -> None:
    """After a restore at offset N of a partition, the stream's re-delivered lines below N are
    skipped (scored and handed off already); once a line at N arrives, none is."""
    detector = Detector.load(synthetic_model_dir)
    book = StreamBook(StateSettings(), 1000)
    state = StreamState("web-1", detector.model_id, "logs/0", 10, 10, 1.0, [5, 6, 7])
    assert book.restore(detector, [state]) == 1
    line = generate_lines(1, seed=6).lines[0]
    assert book.already_scored(LogRecord(line, "web-1", "logs/0", 8, source_kind="kafka"))
    assert book.already_scored(LogRecord(line, "web-1", "logs/0", 9, source_kind="kafka"))
    assert not book.already_scored(LogRecord(line, "web-1", "logs/0", 10, source_kind="kafka"))
    assert not book.already_scored(LogRecord(line, "web-1", "logs/0", 9, source_kind="kafka"))


def forged(header_changes: dict[str, Any], tokens: bytes | None = None) -> bytes:
    """A valid record of stream web-1 with its header fields changed (a value of `...` deletes
    the field) and, if given, other token bytes: what a foreign or hostile writer could send."""
    value = StreamState("web-1", "m@1", "logs/0", 10, 10, 1.5, [5, 6, 7], ["a <*>"]).encode()
    (size,) = struct.unpack("<I", value[4:8])
    header = json.loads(value[8 : 8 + size])
    header.update(header_changes)
    header = {k: v for k, v in header.items() if v is not ...}
    head = json.dumps(header).encode()
    return value[:4] + struct.pack("<I", len(head)) + head + (value[8 + size :] if tokens is None else tokens)


@pytest.mark.parametrize(
    "changes",
    [
        {"offset": "10"},  # a string where a count belongs
        {"offset": -1},
        {"offset": 2**63},  # past Kafka's int64 offsets
        {"offset": 10.5},
        {"lines": True},  # JSON true is no count
        {"lines": ...},  # missing
        {"seen": math.nan},  # JSON NaN is no time
        {"seen": -5},
        {"model": 7},
        {"source": "logs"},  # no partition
        {"learned": [1]},
        {"learned": ["t"] * 17},  # more than a stream keeps
        {"dtype": "<f4"},
    ],
    ids=lambda changes: ",".join(f"{k}={v!r:.12}" for k, v in changes.items()),
)
def test_record_with_a_field_of_the_wrong_type_or_range_is_refused(changes: dict[str, Any]) -> None:
    """Every header field is checked on decode: a wrong type or an impossible value raises
    BadRecord (reason `undecodable`) instead of reaching the restore."""
    with pytest.raises(BadRecord, match="changelog record") as refused:
        StreamState.decode("web-1", forged(changes))
    assert refused.value.reason == "undecodable"


@pytest.mark.parametrize(
    "value",
    [
        forged({}, tokens=b"\x05\x00\x06"),  # 1.5 uint16 token ids: torn
        b"LSC1\xff\x00\x00\x00{}",  # announces a 255-byte header
        b"LSC1\x02\x00\x00\x00[]",  # a header that is no object
        b"LSC1\x09\x00\x00\x00" + b"[" * 9,  # unfinished JSON
    ],
)
def test_torn_record_is_refused_as_undecodable(value: bytes) -> None:
    """A record cut short or not made of whole token ids raises BadRecord (`undecodable`)."""
    with pytest.raises(BadRecord) as refused:
        StreamState.decode("web-1", value)
    assert refused.value.reason == "undecodable"


def test_token_ids_outside_the_vocabulary_fail_the_check() -> None:
    """A token id at or past the model's vocabulary, or a negative one (int32), fails `check`
    with reason `token_ids`; ids inside it pass."""
    StreamState("web-1", "m", "logs/0", 10, 10, 1.0, [0, 5, 99]).check(vocab_size=100, partition_end=10)
    negative = forged({"dtype": "<i4"}, tokens=struct.pack("<2i", -3, 5))
    for value in (StreamState("web-1", "m", "logs/0", 10, 10, 1.0, [5, 100]).encode(), negative):
        with pytest.raises(BadRecord, match="token ids") as refused:
            StreamState.decode("web-1", value).check(vocab_size=100, partition_end=10)
        assert refused.value.reason == "token_ids"


def test_offset_past_the_partition_end_fails_the_check() -> None:
    """A state claiming an offset beyond its input partition's end (which would make every
    later line of the stream look already scored) fails `check` with reason `offset`; an
    offset at the end is what a state covering the partition's last line has, and passes."""
    StreamState("web-1", "m", "logs/0", 10, 10, 1.0, [5]).check(vocab_size=100, partition_end=10)
    with pytest.raises(BadRecord, match="past logs/0's end 10") as refused:
        StreamState("web-1", "m", "logs/0", 2**62, 10, 1.0, [5]).check(vocab_size=100, partition_end=10)
    assert refused.value.reason == "offset"


def test_restorable_keeps_good_states_and_names_failed_streams_by_reason() -> None:
    """Of a read's latest records: good ones of this model and these partitions are kept;
    forged ones are named under their reason; tombstones, another model's records and other
    partitions' streams are left out without counting as failures."""
    good = StreamState("a", "m", "logs/0", 4, 4, 1.0, [5, 6])
    latest = {
        "a": good.encode(),
        "b": StreamState("b", "m", "logs/0", 4, 4, 1.0, [500]).encode(),
        "c": StreamState("c", "m", "logs/0", 2**62, 4, 1.0, [5]).encode(),
        "d": b"not a record",
        "e": None,
        "f": StreamState("f", "other-model", "logs/0", 4, 4, 1.0, [500]).encode(),
        "g": StreamState("g", "m", "logs/1", 4, 4, 1.0, [5]).encode(),
    }
    states, failed = restorable(latest, {"logs/0"}, "m", vocab_size=100, ends={"logs/0": 10})
    assert states == [good]
    assert failed == {"token_ids": ["b"], "offset": ["c"], "undecodable": ["d"]}


def test_stream_whose_rebuild_fails_starts_cold_and_the_others_are_restored(
    synthetic_model_dir: Path,
) -> None:
    """A state that reaches the restore and still breaks the re-encoding (token ids past the
    embedding: the engine raises) costs only its own stream: it starts cold (not in the
    engine, no skipped lines), counted under `rebuild`; the other streams are restored."""
    detector = Detector.load(synthetic_model_dir)
    book = StreamBook(StateSettings(), 1000)
    vocab = detector.engine.vocab_size
    good = StreamState("web-1", detector.model_id, "logs/0", 10, 10, 1.0, [5, 6, 7])
    bad = StreamState("web-2", detector.model_id, "logs/0", 10, 10, 2.0, [5, vocab + 7])
    before = CHANGELOG_RESTORE_FAILURES.labels(reason="rebuild")._value.get()
    assert book.restore(detector, [good, bad]) == 1
    assert CHANGELOG_RESTORE_FAILURES.labels(reason="rebuild")._value.get() - before == 1
    assert detector.engine.tokens("web-1") == [5, 6, 7] and detector.engine.tokens("web-2") == []
    line = generate_lines(1, seed=6).lines[0]
    assert not book.already_scored(LogRecord(line, "web-2", "logs/0", 3, source_kind="kafka"))
    assert book.already_scored(LogRecord(line, "web-1", "logs/0", 3, source_kind="kafka"))
