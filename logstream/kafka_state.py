"""State that follows its partition: each stream's context in a compacted changelog topic.

A stream's detector state is its ring of the last L tokens' keys and values, which is
large (layers x 2 x L x kv heads x head dim) but a pure function of the last L token ids,
which are small (~4 KB at L = 2048 in uint16). So the changelog keeps, per stream:

    tokens      the last L token ids (uint16 when the vocabulary fits, else int32)
    learned     texts of those templates that the model's miner did not start with, so the
                next owner does not find them "new" (novelty would alert on a moved stream)
    lines       lines the stream has had scored (the cold-start policy reads it)
    source      `topic/partition` of its last line, and `offset` (the next offset after it)
    seen        unix time of its last line (restore order: the most recent are re-encoded first)
    model       the model id: token ids of another tokenizer mean nothing, so they are skipped

Records are keyed by stream and sent to changelog partition `input partition mod
changelog partitions`, so the owner of input partition p finds its streams by reading
one changelog partition. A stream closed for idleness gets a tombstone (compaction
deletes it). Not kept: the online tail refit (`OnlineTail`: one per process, fitted on the
scores of all its streams, so not any one stream's state; a new owner's own fit scores a
moved stream, a new process starts from the model's calibration), the miner's templates
beyond the stream's recent ones, and the alert context lines.

Ordering (the guarantee): state is written, acknowledged by all in-sync replicas
(acks=all, idempotent producer), *before* the offsets that it covers are committed; a
failed write skips the commit (the streams stay dirty, the lines are re-delivered). So
a restored state is never older than the committed offsets imply. It can be newer, by
the lines between the last write and a commit that a crash prevented: those lines were
scored and handed off already (the write follows the sink's put), and the new owner
skips them for that stream (`StreamBook.already_scored`) instead of feeding them twice.

Writes happen before each commit, and serve commits at most every
`state.changelog_interval_seconds` (and on revoke and shutdown): one record per stream
scored since the last write, whatever its number of lines, taken on the scorer's worker
thread between batches. Reads happen on partition assignment, before fetching resumes.

Trust: a record is input like any other (another writer, a torn write, a forged value), and
compaction keeps it for good. Every field is checked when it is read (`StreamState.decode`,
`StreamState.check`): types and counts, token ids inside the model's vocabulary, and an
offset no further than its input partition's end (a forged offset would otherwise make every
later line of the stream look "already scored"). A stream whose record fails a check, or
whose re-encoding fails, starts cold: counted in
`logstream_changelog_restore_failures_total{reason}` and logged once per restore, never
blocking its partition.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import struct
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from logstream.consumers.kafka import client_options, ensure_topic
from logstream.detector import Detector, ScoredLine
from logstream.engine.streaming import StreamingEngine
from logstream.metrics import (
    CHANGELOG_RESTORE_FAILURES,
    CHANGELOG_SKIPPED_LINES,
    CHANGELOG_WRITES,
    COLD_LINES,
    SPLIT_STREAMS,
)
from logstream.records import LogRecord
from logstream.settings import KafkaSettings, StateSettings
from logstream.text.patterns import template_id

log = structlog.get_logger(__name__)

MAGIC = b"LSC1"  # format version 1: MAGIC, u32 header length, JSON header, token bytes
SPLIT_WARNINGS = 10  # split streams named in a warning each; further ones are only counted
MAX_LEARNED = 16  # learned templates kept per stream
TOKEN_DTYPES = ("<u2", "<i4")
MAX_OFFSET = 2**63 - 1  # Kafka offsets are int64
SOURCE = re.compile(r".+/\d{1,10}")  # topic/partition
FAILURE_EXAMPLES = 5  # streams named in a restore failure's log line; the rest are counted


class BadRecord(ValueError):
    """A changelog record that is not restored; `reason` is its metric label: `undecodable`
    (not a logstream record, or a field of the wrong type or range), `token_ids` (outside the
    model's vocabulary), `offset` (beyond what its input partition holds)."""

    def __init__(self, reason: str, problem: str) -> None:
        super().__init__(f"changelog record {problem}")
        self.reason = reason


def restore_failed(reason: str, streams: int, **context: object) -> None:
    """Streams that start cold instead of restored: counted by reason, logged once.
    `reason` `read` (the topic could not be read) counts the failed read itself."""
    CHANGELOG_RESTORE_FAILURES.labels(reason=reason).inc(max(streams, 1))
    log.error("changelog_restore_failed", reason=reason, streams=streams, start="cold", **context)


@dataclass
class StreamState:
    """One changelog record: what the next owner of a stream needs to resume it."""

    stream: str
    model: str
    source: str
    offset: int
    lines: int
    seen: float
    tokens: list[int] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        header = {
            "model": self.model,
            "source": self.source,
            "offset": self.offset,
            "lines": self.lines,
            "seen": round(self.seen, 3),
            "learned": self.learned,
            "dtype": "<u2" if max(self.tokens, default=0) < 2**16 else "<i4",
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        tokens = np.asarray(self.tokens, dtype=header["dtype"]).tobytes()
        return MAGIC + struct.pack("<I", len(head)) + head + tokens

    @classmethod
    def decode(cls, stream: str, value: bytes) -> StreamState:
        """A record's state, every field's type and range checked; BadRecord (a ValueError)
        naming what is wrong with a foreign, torn or forged value. Token ids against the
        vocabulary and the offset against the partition: `check`."""
        if value[:4] != MAGIC or len(value) < 8:
            raise BadRecord("undecodable", "magic: not a logstream changelog record")
        (size,) = struct.unpack("<I", value[4:8])
        if 8 + size > len(value):
            raise BadRecord("undecodable", f"header: {size} bytes announced, {len(value) - 8} there")
        try:
            header = json.loads(value[8 : 8 + size])
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a 5,000-digit number, nesting
            raise BadRecord("undecodable", f"header: {type(exc).__name__}") from None
        if not isinstance(header, dict):
            raise BadRecord("undecodable", "header: not a JSON object")
        dtype = header.get("dtype")
        if dtype not in TOKEN_DTYPES:
            raise BadRecord("undecodable", f"header: token dtype {dtype!r:.40}")
        body = value[8 + size :]
        if len(body) % np.dtype(dtype).itemsize:
            raise BadRecord("undecodable", f"tokens: {len(body)} bytes is not a whole number of {dtype}")
        source = _field(header, "source", str)
        if not SOURCE.fullmatch(source):
            raise BadRecord("undecodable", f"source: {source!r:.60} is not topic/partition")
        learned = _field(header, "learned", list)
        if len(learned) > MAX_LEARNED or not all(isinstance(t, str) for t in learned):
            raise BadRecord("undecodable", f"learned: not a list of at most {MAX_LEARNED} texts")
        seen = _field(header, "seen", (int, float))
        if not (math.isfinite(seen) and seen >= 0):
            raise BadRecord("undecodable", f"seen: {seen!r} is not a time")
        return cls(
            stream=stream,
            model=_field(header, "model", str),
            source=source,
            offset=_count(header, "offset"),
            lines=_count(header, "lines"),
            seen=float(seen),
            tokens=np.frombuffer(body, dtype=np.dtype(dtype)).astype(np.int64).tolist(),
            learned=learned,
        )

    def check(self, vocab_size: int, partition_end: int) -> None:
        """BadRecord unless every token id is one of the model's (`token_ids`: an id past
        the embedding would raise inside the re-encoding) and the offset is within what its
        partition holds (`offset`: the next owner skips the stream's lines below it)."""
        if self.tokens and not 0 <= min(self.tokens) <= max(self.tokens) < vocab_size:
            raise BadRecord(
                "token_ids", f"token ids: {min(self.tokens)}..{max(self.tokens)} outside 0..{vocab_size - 1}"
            )
        if self.offset > partition_end:
            raise BadRecord("offset", f"offset: {self.offset} is past {self.source}'s end {partition_end}")


def _field(header: dict[str, object], name: str, kind: type | tuple[type, ...]) -> Any:
    value = header.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):  # JSON true is no count, no time
        raise BadRecord("undecodable", f"{name}: wrong type ({type(value).__name__})")
    return value


def _count(header: dict[str, object], name: str) -> int:
    value = _field(header, name, int)
    if not 0 <= value <= MAX_OFFSET:  # an int64, as Kafka's offsets
        raise BadRecord("undecodable", f"{name}: {value} is outside 0..{MAX_OFFSET}")
    return int(value)


def restorable(
    latest: dict[str, bytes | None], sources: set[str], model_id: str, vocab_size: int, ends: dict[str, int]
) -> tuple[list[StreamState], dict[str, list[str]]]:
    """The latest records' states that this consumer may restore (of `sources`, by
    `model_id`, passing `check` against `ends`: `topic/partition` -> end offset), and the
    streams of those that failed, by reason. Tombstones, other partitions' streams and
    another model's records are left out without a word: they are not ours to restore."""
    states: list[StreamState] = []
    failed: dict[str, list[str]] = defaultdict(list)
    for stream, value in latest.items():
        if value is None:
            continue  # a tombstone: the stream was closed
        try:
            state = StreamState.decode(stream, value)
            if state.source not in sources or state.model != model_id:
                continue
            state.check(vocab_size, ends[state.source])
        except BadRecord as exc:
            failed[exc.reason].append(stream)
            continue
        states.append(state)
    return states, dict(failed)


@dataclass
class _Entry:
    source: str
    offset: int  # next offset after the stream's last scored line on `source`
    lines: int
    seen: float
    learned: dict[int, str] | None = None  # non-seeded templates of its recent lines, oldest first


class StreamBook:
    """Per-stream counters the service keeps: lines, source, offset; the cold-start policy;
    which streams changed since the last changelog write; streams split over partitions.

    Bounded like the idle tracker: at most `max_streams`, least recently seen forgotten.
    """

    def __init__(self, settings: StateSettings, max_streams: int) -> None:
        self.settings = settings
        self.max_streams = max_streams
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._dirty: set[str] = set()
        self._closed: dict[str, str] = {}  # closed since the last write -> last source: tombstones
        self._restored: dict[str, tuple[str, int]] = {}  # stream -> (source, offset) from a restore
        self._split: set[str] = set()

    def lines(self, stream: str) -> int:
        entry = self._entries.get(stream)
        return entry.lines if entry is not None else 0

    def already_scored(self, record: LogRecord) -> bool:
        """A re-delivered line that a restored state already covers (see the module docstring)."""
        covered = self._restored.get(record.stream)
        if covered is None:
            return False
        source, offset = covered
        if record.source == source and record.offset is not None and record.offset < offset:
            CHANGELOG_SKIPPED_LINES.inc()
            return True
        del self._restored[record.stream]  # past the restored point: back to normal
        return False

    def observe(self, scored: Sequence[ScoredLine]) -> list[ScoredLine]:
        """Count the scored lines per stream; lines of streams still short of
        `min_context_lines` get the cold threshold (no alert, or a stricter one)."""
        now = time.time()
        out = []
        for line in scored:
            record = line.record
            entry = self._entries.get(record.stream)
            if entry is None:
                entry = self._entries[record.stream] = _Entry(record.source, 0, 0, now)
            elif entry.source != record.source and record.source_kind == "kafka":
                self._note_split(record.stream, entry.source, record.source)
            self._entries.move_to_end(record.stream)
            if entry.lines < self.settings.min_context_lines and line.kind == "line":
                line = self._cold(line)
            entry.lines += 1
            entry.source = record.source
            entry.offset = (record.offset + 1) if record.offset is not None else entry.offset
            entry.seen = now
            # a template the model's miner did not start with (the detector's seeded clusters)
            if line.template_id is not None and line.template and line.novel:
                learned = entry.learned = entry.learned or {}
                learned.pop(line.template_id, None)
                learned[line.template_id] = line.template
                if len(learned) > MAX_LEARNED:
                    del learned[next(iter(learned))]
            self._dirty.add(record.stream)
            self._closed.pop(record.stream, None)
            out.append(line)
        while len(self._entries) > self.max_streams:
            forgotten, _ = self._entries.popitem(last=False)
            self._dirty.discard(forgotten)
        return out

    def _cold(self, line: ScoredLine) -> ScoredLine:
        threshold = self.settings.cold_threshold
        cold = replace(line, threshold=float("inf") if threshold is None else max(threshold, line.threshold))
        if line.is_anomaly and not cold.is_anomaly:
            COLD_LINES.inc()
        return cold if cold.is_anomaly else replace(cold, explanation=None)

    def _note_split(self, stream: str, before: str, now: str) -> None:
        if stream in self._split:
            return
        self._split.add(stream)
        SPLIT_STREAMS.inc()
        if len(self._split) <= SPLIT_WARNINGS:
            log.warning(
                "stream_split_across_partitions",
                fix="key producers by stream, or set repartition.topic (docs/serve.md)",
                stream=stream,
                partitions=[before, now],
                further_ones_only_counted=len(self._split) == SPLIT_WARNINGS,
            )

    def closed(self, stream: str) -> None:
        """The stream was closed (idle): forget it, and delete its changelog record."""
        entry = self._entries.pop(stream, None)
        self._dirty.discard(stream)
        self._restored.pop(stream, None)
        if entry is not None:
            self._closed[stream] = entry.source

    def take_changes(self, detector: Detector) -> tuple[list[StreamState], dict[str, str]]:
        """States of the streams scored since the last call, and the closed ones (stream ->
        last source) whose records are to be deleted. Call it on the scorer's worker thread."""
        states = [self._state(detector, s) for s in self._dirty if s in self._entries]
        closed = self._closed
        self._dirty, self._closed = set(), {}
        return states, closed

    def give_back(self, states: Iterable[StreamState], closed: dict[str, str]) -> None:
        """A write failed: these go again with the next one."""
        self._dirty.update(s.stream for s in states if s.stream in self._entries)
        self._closed.update({s: src for s, src in closed.items() if s not in self._entries})

    def _state(self, detector: Detector, stream: str) -> StreamState:
        entry = self._entries[stream]
        return StreamState(
            stream=stream,
            model=detector.model_id,
            source=entry.source,
            offset=entry.offset,
            lines=entry.lines,
            seen=entry.seen,
            tokens=detector.engine.tokens(stream),
            learned=list((entry.learned or {}).values()),
        )

    def restore(self, detector: Detector, states: Sequence[StreamState]) -> int:
        """Set the given streams up (least recently seen first) unless what is held is as new;
        returns how many were restored. A stream whose re-encoding fails starts cold (see
        `_rebuild`). Runs on the scorer's worker thread."""
        fresh = [s for s in states if s.model == detector.model_id and not self._holds(s)]
        rebuilt = _rebuild(detector.engine, fresh)
        for state in rebuilt:
            for text in state.learned:
                if detector.scorer.miner.match(text) is None:
                    detector.scorer.miner.add(text)
            learned = {template_id(t): t for t in state.learned} or None
            self._entries[state.stream] = _Entry(state.source, state.offset, state.lines, state.seen, learned)
            self._entries.move_to_end(state.stream)
            self._restored[state.stream] = (state.source, state.offset)
        return len(rebuilt)

    def _holds(self, state: StreamState) -> bool:
        """This consumer already holds the stream as far as the record goes (it kept it)."""
        entry = self._entries.get(state.stream)
        return entry is not None and entry.source == state.source and entry.offset >= state.offset

    def forget_unassigned(self, detector: Detector, assigned: set[str]) -> int:
        """Drop streams of Kafka partitions this consumer no longer owns (their new owner
        restores them; a stale copy here would only hold cache). Returns how many."""
        gone = [s for s, e in self._entries.items() if e.source not in assigned]
        for stream in gone:
            del self._entries[stream]
            self._dirty.discard(stream)
            self._restored.pop(stream, None)
            detector.engine.drop(stream)
        return len(gone)


def _rebuild(engine: StreamingEngine, states: Sequence[StreamState]) -> list[StreamState]:
    """Re-encode the streams from their token ids; the states that made it. Should the
    re-encoding of all at once raise (whatever the cause: it runs inside a rebalance, so
    nothing may escape), each is tried alone, and one that fails again is dropped: it
    starts cold, counted (`rebuild`), and costs the others nothing."""
    try:
        engine.rebuild({s.stream: s.tokens for s in states})
        return list(states)
    except Exception:  # retried one by one below, where a failure is reported
        for state in states:
            engine.drop(state.stream)
    rebuilt, failed, error = [], [], ""
    for state in states:
        try:
            engine.rebuild({state.stream: state.tokens})
        except Exception as exc:  # this stream starts cold; reported below
            engine.drop(state.stream)
            failed.append(state.stream)
            error = error or repr(exc)
        else:
            rebuilt.append(state)
    if failed:
        restore_failed("rebuild", len(failed), examples=failed[:FAILURE_EXAMPLES], error=error)
    return rebuilt


def _topic_partition(source: str) -> tuple[str, int]:
    """`topic/partition` -> (topic, partition) (a Kafka source always ends in its partition number)."""
    topic, partition = source.rsplit("/", 1)
    return topic, int(partition)


class Changelog:
    """The compacted changelog topic: `write` (acks=all, idempotent) and `read` on assignment."""

    def __init__(self, kafka: KafkaSettings, state: StateSettings, input_topics: Sequence[str]) -> None:
        assert state.changelog_topic is not None
        self.kafka = kafka
        self.state = state
        self.topic = state.changelog_topic
        self.input_topics = list(input_topics)
        self.partitions = 0  # known after start()
        options = client_options(kafka)
        self._producer = AIOKafkaProducer(acks="all", enable_idempotence=True, linger_ms=5, **options)
        self._reader = AIOKafkaConsumer(enable_auto_commit=False, auto_offset_reset="earliest", **options)

    async def start(self) -> None:
        """Connect; create the topic (compacted) if it is missing; learn its partition count."""
        await self._producer.start()
        await self._reader.start()
        try:
            self.partitions = await ensure_topic(
                self.kafka, self._producer, self.topic, self.state.changelog_partitions, self.input_topics,
                self.state.changelog_replication, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            )  # fmt: skip
        except BaseException:
            await self.stop()
            raise
        log.info("changelog_ready", topic=self.topic, partitions=self.partitions)

    async def stop(self) -> None:
        await self._producer.stop()
        await self._reader.stop()

    def _changelog_partition(self, source: str) -> int:
        return _topic_partition(source)[1] % self.partitions

    async def write(self, states: Sequence[StreamState], closed: dict[str, str]) -> bool:
        """Send the states and tombstones; True once all are acknowledged. Never raises a Kafka
        error: a failure is logged and counted, and the caller must not commit."""
        try:
            futures = [
                await self._producer.send(
                    self.topic,
                    s.encode(),
                    key=s.stream.encode(),
                    partition=self._changelog_partition(s.source),
                )
                for s in states
            ]
            futures += [
                await self._producer.send(
                    self.topic, None, key=stream.encode(), partition=self._changelog_partition(source)
                )
                for stream, source in closed.items()
            ]
            await asyncio.gather(*futures)
        except KafkaError as exc:
            CHANGELOG_WRITES.labels(outcome="failed").inc()
            log.warning("changelog_write_failed", offsets="uncommitted", error=str(exc) or repr(exc))
            return False
        CHANGELOG_WRITES.labels(outcome="ok").inc(len(futures))
        return True

    async def read(self, sources: set[str], model_id: str, vocab_size: int) -> list[StreamState]:
        """The latest state of every stream whose last line came from one of `sources`
        (`topic/partition`) by `model_id`, least recently seen first. Records that fail their
        checks (`StreamState.check` with `vocab_size` and the input partitions' end offsets)
        are left out: their streams start cold, counted and logged once per reason."""
        tps = sorted({TopicPartition(self.topic, self._changelog_partition(s)) for s in sources})
        if not tps:
            return []
        self._reader.assign(tps)
        ends = await self._reader.end_offsets(tps)
        await self._reader.seek_to_beginning(*tps)
        latest: dict[str, bytes | None] = {}
        deadline = time.monotonic() + self.state.restore_timeout_seconds
        pending = {tp for tp in tps if ends[tp] > 0}
        while pending:
            if time.monotonic() > deadline:
                raise KafkaError(f"changelog restore incomplete after {self.state.restore_timeout_seconds}s")
            fetched = await self._reader.getmany(*pending, timeout_ms=500)
            for messages in fetched.values():
                for message in messages:
                    if message.key is not None:
                        latest[message.key.decode("utf-8", "replace")] = message.value
            pending = {tp for tp in pending if await self._reader.position(tp) < ends[tp]}
        inputs = {TopicPartition(*_topic_partition(s)): s for s in sources}
        ends = {inputs[tp]: end for tp, end in (await self._reader.end_offsets(list(inputs))).items()}
        states, failed = restorable(latest, sources, model_id, vocab_size, ends)
        for reason, streams in failed.items():
            restore_failed(reason, len(streams), topic=self.topic, examples=streams[:FAILURE_EXAMPLES])
        states.sort(key=lambda s: s.seen)
        return states
