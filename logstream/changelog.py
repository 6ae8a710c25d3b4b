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
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from logstream.consumers.kafka import client_options, ensure_topic
from logstream.detector import Detector, ScoredLine
from logstream.metrics import (
    CHANGELOG_SKIPPED_LINES,
    CHANGELOG_WRITES,
    COLD_LINES,
    SPLIT_STREAMS,
)
from logstream.patterns import template_id
from logstream.records import LogRecord
from logstream.settings import KafkaSettings, StateSettings

log = structlog.get_logger(__name__)

MAGIC = b"LSC1"  # format version 1: MAGIC, u32 header length, JSON header, token bytes
SPLIT_WARNINGS = 10  # split streams named in a warning each; further ones are only counted
MAX_LEARNED = 16  # learned templates kept per stream


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
        """A record's state; ValueError naming what is wrong with a foreign or torn value."""
        if value[:4] != MAGIC or len(value) < 8:
            raise ValueError("not a logstream changelog record (magic)")
        (size,) = struct.unpack("<I", value[4:8])
        try:
            header = json.loads(value[8 : 8 + size])
            if header["dtype"] not in ("<u2", "<i4"):
                raise ValueError(f"token dtype {header['dtype']!r}")
            tokens = np.frombuffer(value[8 + size :], dtype=np.dtype(header["dtype"]))
            return cls(
                stream=stream,
                model=str(header["model"]),
                source=str(header["source"]),
                offset=int(header["offset"]),
                lines=int(header["lines"]),
                seen=float(header["seen"]),
                tokens=tokens.astype(np.int64).tolist(),
                learned=[str(t) for t in header["learned"]],
            )
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"changelog record header: {exc}") from None


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
        returns how many were restored. Runs on the scorer's worker thread."""
        fresh = [s for s in states if s.model == detector.model_id and not self._holds(s)]
        for state in fresh:
            for text in state.learned:
                if detector.scorer.miner.match(text) is None:
                    detector.scorer.miner.add(text)
            learned = {template_id(t): t for t in state.learned} or None
            self._entries[state.stream] = _Entry(state.source, state.offset, state.lines, state.seen, learned)
            self._entries.move_to_end(state.stream)
            self._restored[state.stream] = (state.source, state.offset)
        detector.engine.rebuild({s.stream: s.tokens for s in fresh})
        return len(fresh)

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


def _partition_of(source: str) -> int:
    """`topic/partition` -> partition (a Kafka source always ends in its partition number)."""
    return int(source.rsplit("/", 1)[1])


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
        return _partition_of(source) % self.partitions

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

    async def read(self, sources: set[str]) -> list[StreamState]:
        """The latest state of every stream whose last line came from one of `sources`
        (`topic/partition`), least recently seen first; records of another model or that do
        not decode are skipped (logged once per read)."""
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
        states, bad = [], 0
        for stream, value in latest.items():
            if value is None:
                continue  # a tombstone: the stream was closed
            try:
                state = StreamState.decode(stream, value)
            except ValueError:
                bad += 1
                continue
            if state.source in sources:
                states.append(state)
        if bad:
            log.warning("changelog_records_undecodable", count=bad, topic=self.topic)
        states.sort(key=lambda s: s.seen)
        return states
