"""Kafka source: an aiokafka consumer-group member that fetches parsed batches.

It never commits on its own (`enable_auto_commit=False`): the service commits
`offset + 1` with `commit()` after a batch's anomalies are handed off. A
Batch carries, per partition, the next offset to commit for everything it
covers, bad messages included, so a poison message never blocks a partition.
Bad messages are counted, logged once per kind and, if configured, copied to
the dead-letter topic. The copy is acknowledged (acks=all) before the batch
covers its offset: when the copy fails, the batch stops that partition just
before the message, the consumer seeks back to it and holds the partition
(paused) for a backoff, then fetches and tries again. A partition whose
dead-letter copies keep failing stops there, loudly (error log and
`logstream_dead_letter_failures_total`); it never commits past a message it
could not keep.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError, KafkaError, TopicAlreadyExistsError
from aiokafka.helpers import create_ssl_context

from logstream.consumers.multiline import join_batch, joiner_for
from logstream.consumers.parse import RecordParser, Rejected, RejectLog
from logstream.metrics import COMMITS, CONSUMER_LAG, DEAD_LETTER_FAILURES, DEAD_LETTERS
from logstream.records import LogRecord
from logstream.settings import KafkaSettings

log = structlog.get_logger(__name__)

# Backoff before a partition whose dead-letter copy failed is fetched again: doubles per
# failure in a row, from the first to the cap.
DEAD_LETTER_RETRY_SECONDS = (0.5, 30.0)


@dataclass
class Batch:
    """Parsed records of one fetch, and per partition the next offset to commit after them."""

    records: list[LogRecord] = field(default_factory=list)
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    messages: int = 0  # records + rejected messages

    def extend(self, later: Batch) -> None:
        """Append a later fetch: its records follow, its offsets supersede (fetches are in order)."""
        self.records.extend(later.records)
        self.next_offsets.update(later.next_offsets)
        self.messages += later.messages


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """Connection options shared by the consumer and the dead-letter producer."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        cafile = str(settings.ssl_cafile) if settings.ssl_cafile else None
        options["ssl_context"] = create_ssl_context(cafile=cafile)
    if settings.sasl_mechanism is not None and settings.sasl_password is not None:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return options


def group_consumer(settings: KafkaSettings, group_id: str) -> AIOKafkaConsumer:
    """A consumer in `group_id` that commits only what it is told to (no auto-commit), with
    the poll and session limits of `settings` (the scorer's and the repartition stage's)."""
    return AIOKafkaConsumer(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=settings.auto_offset_reset,
        max_poll_records=settings.max_poll_records,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        metadata_max_age_ms=settings.metadata_max_age_ms,
        **client_options(settings),
    )


async def topic_partitions(producer: AIOKafkaProducer, topic: str, wait: bool = False) -> set[int]:
    """The topic's partitions ({} if unknown); with `wait`, until each has a leader (10 s)."""
    for _ in range(100 if wait else 1):
        await producer.client.force_metadata_update()
        found = producer.client.cluster.partitions_for_topic(topic)
        if found and (not wait or all(p is not None for p in found)):
            return set(found)
        await asyncio.sleep(0.1)
    if wait:
        raise KafkaError(f"topic {topic} has no leaders after 10s")
    return set()


async def ensure_topic(
    settings: KafkaSettings,
    producer: AIOKafkaProducer,
    topic: str,
    partitions: int | None,
    like: list[str],
    replication: int = -1,
    config: dict[str, str] | None = None,
) -> int:
    """Create `topic` if it is missing (the internal topics: changelog, repartition) with
    `partitions`, or as many as the topic in `like` with the most; its partition count."""
    found = await topic_partitions(producer, topic)
    if not found:
        wanted = partitions or max([len(await topic_partitions(producer, t)) for t in like] + [1])
        admin = AIOKafkaAdminClient(**client_options(settings))
        await admin.start()
        try:
            # -1 = the broker's default replication; aiokafka wants an (empty) assignment then
            assignments = {} if replication == -1 else None
            response = await admin.create_topics([NewTopic(topic, wanted, replication, assignments, config)])
        finally:
            await admin.close()
        for name, code, *_ in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                raise KafkaError(f"cannot create topic {name}: error code {code}")
        found = await topic_partitions(producer, topic, wait=True)
    return len(found)


class KafkaSource:
    """Subscribes to the configured topics (names or a pattern) in a consumer group."""

    def __init__(
        self,
        settings: KafkaSettings,
        parser: RecordParser,
        rejects: RejectLog,
        listener: ConsumerRebalanceListener,
    ) -> None:
        self.settings = settings
        self.parser = parser
        self.rejects = rejects
        self.listener = listener
        self.joiner = joiner_for(parser.settings)  # input.multiline; off by default
        self.consumer = group_consumer(settings, settings.group_id)
        self._dead_letters: AIOKafkaProducer | None = None
        self._held: dict[TopicPartition, float] = {}  # dead-letter copy failed: retry after (monotonic)
        self._failures: dict[TopicPartition, int] = {}  # failed copies in a row, per partition
        self._paused = False  # backpressure (pause/resume); held partitions stay paused regardless

    async def start(self) -> None:
        if self.settings.dead_letter_topic:
            self._dead_letters = AIOKafkaProducer(acks="all", **client_options(self.settings))
            await self._dead_letters.start()
        await self.consumer.start()
        if self.settings.topic_pattern is not None:
            self.consumer.subscribe(pattern=self.settings.topic_pattern, listener=self.listener)
        else:
            self.consumer.subscribe(topics=self.settings.topics, listener=self.listener)
        log.info(
            "kafka_consumer_started",
            group=self.settings.group_id,
            topics=self.settings.topics or self.settings.topic_pattern,
        )

    async def stop(self) -> None:
        """Leave the group (a last revoke runs through the listener) and close connections."""
        await self.consumer.stop()
        if self._dead_letters is not None:
            await self._dead_letters.stop()

    async def fetch(self) -> Batch:
        """One `getmany` (at most max_poll_records, waits at most fetch_timeout_ms), parsed.

        A partition stops at a bad message whose dead-letter copy failed: the batch's next
        offset for it is that message's, so nothing from it on is committed or scored yet.
        """
        self._release_held()
        fetched = await self.consumer.getmany(
            timeout_ms=self.settings.fetch_timeout_ms, max_records=self.settings.max_poll_records
        )
        batch = Batch()
        for tp, messages in fetched.items():
            if tp in self._held:
                self.consumer.seek(tp, messages[0].offset)  # not ours to take yet: fetch again later
                continue
            source = f"{tp.topic}/{tp.partition}"
            for message in messages:
                timestamp = message.timestamp / 1000 if message.timestamp is not None else None
                parsed = self.parser.parse(
                    message.value,
                    key=message.key,
                    source=source,
                    offset=message.offset,
                    timestamp=timestamp,
                    source_kind="kafka",
                )
                if isinstance(parsed, Rejected):
                    if not await self._dead_letter(tp, message, parsed, source):
                        self._hold(tp, message.offset)
                        break
                    self.rejects.add(parsed, topic=tp.topic, partition=tp.partition, offset=message.offset)
                else:
                    batch.records.append(parsed)
                batch.next_offsets[tp] = message.offset + 1
                batch.messages += 1
        batch.records = join_batch(batch.records, self.joiner)  # an event never spans two fetches
        return batch

    async def _dead_letter(self, tp: TopicPartition, message: Any, rejected: Rejected, source: str) -> bool:
        """Copy a bad message to the dead-letter topic; True once acknowledged (or none is set)."""
        if self._dead_letters is None or self.settings.dead_letter_topic is None:
            return True
        headers = [
            ("logstream-reject", rejected.kind.encode()),
            ("logstream-source", f"{source}/{message.offset}".encode()),
        ]
        try:
            await self._dead_letters.send_and_wait(
                self.settings.dead_letter_topic, message.value, key=message.key, headers=headers
            )
        except KafkaError as exc:
            DEAD_LETTER_FAILURES.inc()
            log.error(
                "dead_letter_copy_failed",  # the partition waits at this message and retries
                retrying=True,
                topic=tp.topic,
                partition=tp.partition,
                offset=message.offset,
                kind=rejected.kind,
                error=str(exc) or type(exc).__name__,
            )
            return False
        DEAD_LETTERS.inc()
        self._failures.pop(tp, None)
        return True

    def _hold(self, tp: TopicPartition, offset: int) -> None:
        """Rewind `tp` to `offset` and pause it for a backoff (see DEAD_LETTER_RETRY_SECONDS)."""
        if tp not in self.consumer.assignment():
            return  # revoked while the copy was tried: its next owner starts at the committed offset
        failures = self._failures.get(tp, 0)
        self._failures[tp] = failures + 1
        first, cap = DEAD_LETTER_RETRY_SECONDS
        self._held[tp] = time.monotonic() + min(first * 2**failures, cap)
        self.consumer.seek(tp, offset)
        self.consumer.pause(tp)

    def _release_held(self) -> None:
        """Resume held partitions whose backoff is over (unless backpressure pauses all)."""
        now = time.monotonic()
        assigned = self.consumer.assignment()
        for tp, until in list(self._held.items()):
            if tp not in assigned:
                del self._held[tp]  # revoked: its next owner starts from the committed offset
            elif now >= until:
                del self._held[tp]
                if not self._paused:
                    self.consumer.resume(tp)

    async def commit(self, offsets: dict[TopicPartition, int]) -> bool:
        """Commit next offsets of partitions we still own; False if the commit failed.

        A failure (a rebalance took the partitions, the broker is away) is logged
        and counted, never raised: the offsets stay uncommitted, so their
        messages are delivered again (at-least-once).
        """
        owned = {tp: offset for tp, offset in offsets.items() if tp in self.consumer.assignment()}
        if not owned:
            return True
        try:
            await self.consumer.commit(owned)
        except (CommitFailedError, KafkaError) as exc:
            COMMITS.labels(outcome="failed").inc()
            log.warning("offset_commit_failed", retrying=True, error=str(exc), partitions=len(owned))
            return False
        COMMITS.labels(outcome="ok").inc()
        return True

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    def assigned(self, partitions: set[TopicPartition]) -> None:
        """A rebalance handed these out fresh (unpaused, at their committed offsets): no holds."""
        self._paused = False
        for tp in partitions:
            self._held.pop(tp, None)
            self._failures.pop(tp, None)

    def pause(self) -> None:
        self._paused = True
        self.consumer.pause(*self.consumer.assignment())

    def resume(self) -> None:
        """Resume all assigned partitions except those held after a failed dead-letter copy."""
        self._paused = False
        self.consumer.resume(*(tp for tp in self.consumer.assignment() if tp not in self._held))

    def record_lag(self, next_offsets: dict[TopicPartition, int]) -> None:
        """Set `logstream_consumer_lag` = high watermark - next offset to hand off."""
        for tp, offset in next_offsets.items():
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                lag = max(highwater - offset, 0)
                CONSUMER_LAG.labels(topic=tp.topic, partition=str(tp.partition)).set(lag)
