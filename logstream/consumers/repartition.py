"""The repartition stage: stream affinity when producers do not key by stream.

Log shippers (Fluent Bit, Vector, Filebeat) often key by something else or not at all,
with the stream in a JSON field or a regex on the line. Then one stream's lines land on
several partitions, hence several consumers, each seeing a fragment with broken context.
As Kafka Streams does with its repartition topics, this stage reads the raw topic, takes
each message's stream key as `input` says (`RecordParser`, the scorer's own parser), and
produces the message unchanged (value, timestamp, headers) to `repartition.topic` keyed by
the stream. The default partitioner hashes the key (murmur2, as Kafka's Java clients do),
so every line of a stream lands on one partition and so reaches one scorer, which reads
that topic with the message key as the stream (`scorer_inputs`).

Delivery: the producer is idempotent with acks=all, and the stage commits a batch's input
offsets only after every copy of the batch is acknowledged. A failed send commits nothing
and fetches the batch again after a backoff; a crash re-sends from the last commit. So no
line is lost, and a line may be copied twice (at-least-once, as the scorer is).

A message the parser rejects is forwarded with its own key: the scorer rejects it again,
counts it and dead-letters it, in one place. It runs inside `logstream serve`
(`repartition.in_process`) or alone (`logstream serve --role repartition`, no model).
"""

from __future__ import annotations

import asyncio

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord

from logstream.consumers.kafka import client_options, ensure_topic, group_consumer
from logstream.consumers.parse import RecordParser, Rejected
from logstream.metrics import REPARTITIONED, Health, serve_http
from logstream.settings import InputSettings, KafkaSettings, ServeSettings

log = structlog.get_logger(__name__)

RETRY_SECONDS = 1.0  # backoff before a batch whose copies failed is fetched again


def scorer_inputs(settings: ServeSettings) -> tuple[KafkaSettings, InputSettings]:
    """What the scorer consumes: the raw topics as configured, or, with a repartition topic,
    that topic with the message key as the stream key."""
    topic = settings.repartition.topic
    if topic is None:
        return settings.kafka, settings.input
    kafka = settings.kafka.model_copy(update={"topics": [topic], "topic_pattern": None})
    return kafka, settings.input.model_copy(update={"stream_key": "message_key"})


async def prepare_topic(settings: ServeSettings) -> int:
    """Create the repartition topic if it is missing (before the scorer subscribes to it, so
    it is assigned at once, not after a metadata refresh); its partition count."""
    assert settings.repartition.topic is not None
    kafka = settings.kafka
    producer = AIOKafkaProducer(**client_options(kafka))
    await producer.start()
    try:
        return await ensure_topic(
            kafka, producer, settings.repartition.topic, settings.repartition.partitions, kafka.topics
        )
    finally:
        await producer.stop()


class Repartitioner:
    """Raw topic -> repartition topic keyed by stream; commits input after output acks."""

    def __init__(self, settings: ServeSettings) -> None:
        assert settings.repartition.topic is not None
        self.settings = settings
        self.topic = settings.repartition.topic
        self.parser = RecordParser(settings.input)
        kafka = settings.kafka.model_copy(update={"client_id": f"{settings.kafka.client_id}-repartition"})
        self.consumer = group_consumer(kafka, settings.repartition.group_id)
        self.producer = AIOKafkaProducer(
            acks="all", enable_idempotence=True, linger_ms=5, **client_options(kafka)
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Forward until `stop` is set; then leave the group (uncommitted input is re-read)."""
        await self.producer.start()
        try:
            await self.consumer.start()
            try:
                await self._forward_until(stop)
            finally:
                await self.consumer.stop()
        finally:
            await self.producer.stop()

    async def _forward_until(self, stop: asyncio.Event) -> None:
        kafka = self.settings.kafka
        partitions = await prepare_topic(self.settings)
        if kafka.topic_pattern is not None:
            self.consumer.subscribe(pattern=kafka.topic_pattern)
        else:
            self.consumer.subscribe(topics=kafka.topics)
        log.info("repartition_started", to=self.topic, partitions=partitions)
        while not stop.is_set():
            fetched = await self.consumer.getmany(
                timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.max_poll_records
            )
            if fetched and not await self._forward(fetched):
                for tp, messages in fetched.items():
                    self.consumer.seek(tp, messages[0].offset)  # fetched again, nothing committed
                await asyncio.sleep(RETRY_SECONDS)

    async def _forward(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> bool:
        """Copy a fetch keyed by stream; commit its offsets once all copies are acknowledged."""
        try:
            futures = []
            for tp, messages in fetched.items():
                source = f"{tp.topic}/{tp.partition}"
                for message in messages:
                    futures.append(
                        await self.producer.send(
                            self.topic,
                            message.value,
                            key=self._stream_key(message, source),
                            timestamp_ms=message.timestamp,
                            headers=list(message.headers or ()),
                        )
                    )
            await asyncio.gather(*futures)
        except KafkaError as exc:
            log.warning("repartition_copy_failed", batch="fetched again", error=str(exc) or repr(exc))
            return False
        REPARTITIONED.inc(len(futures))
        offsets = {tp: messages[-1].offset + 1 for tp, messages in fetched.items()}
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:  # a rebalance took them: re-read, re-sent
            log.warning("repartition_commit_failed", input="copied again", error=str(exc))
        return True

    def _stream_key(self, message: ConsumerRecord, source: str) -> bytes | None:
        parsed = self.parser.parse(
            message.value, key=message.key, source=source, offset=message.offset, source_kind="kafka"
        )
        if isinstance(parsed, Rejected):
            return message.key  # the scorer rejects it again, counts it and dead-letters it
        return parsed.stream.encode()


async def serve_repartition(settings: ServeSettings, stop: asyncio.Event) -> None:
    """`logstream serve --role repartition`: the stage alone, with /healthz and /metrics."""
    health = Health(model_loaded=True)  # no model in this role
    server = serve_http(settings.http.host, settings.http.port, health)
    try:
        task = asyncio.create_task(Repartitioner(settings).run(stop))
        health.partitions_assigned = True
        await task
    finally:
        health.alive = False
        server.shutdown()
