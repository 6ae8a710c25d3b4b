"""`logstream serve` against hostile input and failing parts, on a real broker.

Poison messages (JSON nested past the recursion limit, a line that makes a
backtracking regex hang), a dead-letter topic that refuses copies, and a
flood of distinct stream keys: serve keeps consuming, never commits past a
message it could not keep, and its memory for streams stays capped. /healthz
fails when scoring or delivery is dead, or partitions are held and not fetched.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from alerts_support import webhook, write_routes
from kafka_broker import KafkaBroker, committed_offsets, create_topic, end_offsets, free_port, produce
from serve_support import ODD_LINE, WAIT_S, Serve, fully_committed, new_topic, normal_lines, wait_for

from logstream.alerts.pipeline import open_alert_sink
from logstream.alerts.sink import JsonlSink
from logstream.detector import Detector
from logstream.lifecycle.feedback import Feedback, FeedbackRules, FeedbackStore
from logstream.metrics import Health, serve_http
from logstream.serve import AuditLog, Service
from logstream.settings import ServeSettings


def as_json(messages: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes | None, bytes | None]]:
    """Normal (key, line) messages as JSON records {"message": line, "host": key}."""
    return [(k, json.dumps({"message": v.decode(), "host": k.decode()}).encode()) for k, v in messages]


JSON_INPUT = {"format": "json", "stream_key": "json_field", "stream_field": "host"}


@pytest.mark.kafka
def test_deeply_nested_json_message_is_rejected_and_serve_keeps_consuming(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A 60 KB `[[[...]]]` message (a RecursionError in json) is one bad_json reject,
    dead-lettered; the lines after it are scored and everything is committed."""
    topic, group = new_topic(kafka_broker, partitions=1)
    dead = f"{topic}-dead"
    asyncio.run(create_topic(kafka_broker.bootstrap, dead, 1))
    good = as_json(normal_lines(20, seed=31))
    poison = b"[" * 30_000 + b"]" * 30_000
    asyncio.run(produce(kafka_broker.bootstrap, topic, [*good[:10], (b"k", poison), *good[10:]]))
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        kafka={"dead_letter_topic": dead}, input=JSON_INPUT,
    ).start()  # fmt: skip
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
    assert serve.metric("logstream_bad_records_total", kind="bad_json") == 1
    assert serve.metric("logstream_dead_letters_total") == 1
    assert serve.terminate() == 0
    assert len(serve.audited()) == len(good)


@pytest.mark.kafka
def test_backtracking_stream_regex_does_not_stall_serve(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With stream_regex `(a+)+$`, a 47-byte line that makes Python's re backtrack for hours
    is matched (RE2), the lines after it are scored, and SIGTERM exits cleanly."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages: list[tuple[bytes | None, bytes | None]] = list(normal_lines(10, seed=32))
    messages.insert(5, (None, b"a" * 46 + b"!"))
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        input={"stream_key": "regex", "stream_regex": r"(a+)+$"},
    ).start()  # fmt: skip
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
    assert serve.terminate() == 0
    assert len(serve.audited()) == len(messages)


async def _create_small_topic(bootstrap: str, name: str, max_message_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"max.message.bytes": str(max_message_bytes)}
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs=config)])
    finally:
        await admin.close()


async def _set_max_message_bytes(bootstrap: str, name: str, max_message_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"max.message.bytes": str(max_message_bytes)}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=config)])
    finally:
        await admin.close()


@pytest.mark.kafka
def test_failed_dead_letter_copy_holds_the_partition_until_the_copy_succeeds(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """While the dead-letter topic refuses a bad message's copy (too large for it), the
    partition's committed offset stays at that message, through retries; once the topic takes
    it, the copy is made first and then everything is committed. Nothing is lost."""
    topic, group = new_topic(kafka_broker, partitions=1)
    dead = f"{topic}-dead"
    asyncio.run(_create_small_topic(kafka_broker.bootstrap, dead, max_message_bytes=64))
    good = as_json(normal_lines(20, seed=33))
    poison = b"{not json " + b"x" * 500
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, [*good[:10], (b"k", poison), *good[10:]]))
    poison_offset = placed[10][1]
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        kafka={"dead_letter_topic": dead}, input=JSON_INPUT,
    ).start()  # fmt: skip
    wait_for(serve.ready, "serve ready")

    def committed() -> int:
        return asyncio.run(committed_offsets(kafka_broker.bootstrap, group)).get((topic, 0), 0)

    wait_for(lambda: serve.metric("logstream_dead_letter_failures_total") >= 3, "three failed copies")
    wait_for(lambda: committed() == poison_offset, "the lines before the poison committed")
    assert serve.metric("logstream_dead_letter_failures_total") >= 3  # retried, still held
    assert committed() == poison_offset
    assert serve.metric("logstream_lines_total") == 10
    asyncio.run(_set_max_message_bytes(kafka_broker.bootstrap, dead, 1_048_576))
    wait_for(
        lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed once the topic takes it"
    )
    assert asyncio.run(end_offsets(kafka_broker.bootstrap, dead, [0]))[0] == 1
    assert serve.metric("logstream_dead_letters_total") == 1
    assert serve.metric("logstream_bad_records_total", kind="bad_json") == 1
    assert serve.terminate() == 0
    assert len(serve.audited()) == len(good)


@pytest.mark.kafka
def test_stream_tracker_is_capped_and_counts_evictions(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """40 distinct stream keys with max_tracked_streams 8 leave 8 tracked and 32 evicted."""
    topic, group = new_topic(kafka_broker, partitions=1)
    lines = normal_lines(40, seed=34)
    messages = [(f"key-{i}".encode(), value) for i, (_, value) in enumerate(lines)]
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        stream_idle_seconds=3600, max_tracked_streams=8,
    ).start()  # fmt: skip
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
    assert serve.metric("logstream_tracked_streams") == 8
    assert serve.metric("logstream_tracked_stream_evictions_total") == 32
    assert serve.terminate() == 0


def _healthz(health: Health) -> int:
    server = serve_http("127.0.0.1", free_port(), health)
    try:
        return _probe(server)
    finally:
        server.shutdown()
        server.server_close()


def _probe(server: Any) -> int:
    host, port = server.server_address[:2]
    return httpx.get(f"http://{host}:{port}/healthz", timeout=10.0).status_code


def test_healthz_is_200_while_scoring_and_the_sink_delivers() -> None:
    """The baseline for the two tests below: loaded, scoring, sink healthy -> 200."""
    assert _healthz(Health(model_loaded=True, sink_healthy=lambda: True)) == 200


def test_healthz_fails_when_the_sink_reports_unhealthy() -> None:
    """/healthz is 503 once the sink says it no longer delivers (sink.healthy() is False)."""
    assert _healthz(Health(model_loaded=True, sink_healthy=lambda: False)) == 503


def test_healthz_fails_when_the_sink_cannot_say() -> None:
    """A sink whose healthy() raises counts as unhealthy: the probe answers 503, not 500."""

    def broken() -> bool:
        raise RuntimeError(uuid.uuid4().hex)

    assert _healthz(Health(model_loaded=True, sink_healthy=broken)) == 503


def test_healthz_fails_once_the_scorer_has_ended() -> None:
    """/healthz is 503 when the scorer loop is no longer running."""
    assert _healthz(Health(model_loaded=True, scoring=False)) == 503


@pytest.mark.kafka
def test_healthz_turns_503_when_the_scorer_loop_dies(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A real failure inside scoring (the audit log's disk is full: /dev/full) ends the scorer
    loop; Health then reports unhealthy, and Service.run raises instead of serving on."""
    topic, group = new_topic(kafka_broker, partitions=1)
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(5, seed=35)))
    settings = ServeSettings(
        model={"dir": synthetic_model_dir, "threads": 1},
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "topics": [topic], "group_id": group},
        sink={"kind": "jsonl", "path": tmp_path / "anomalies.jsonl"},
    )
    health = Health(model_loaded=True)
    sink = JsonlSink(tmp_path / "anomalies.jsonl")

    async def run() -> None:
        service = Service(
            settings, Detector.load(synthetic_model_dir), sink, health, AuditLog(Path("/dev/full"))
        )
        await asyncio.wait_for(service.run(asyncio.Event()), timeout=WAIT_S)

    try:
        with pytest.raises(OSError, match="No space left"):
            asyncio.run(run())
    finally:
        sink.close()
    assert health.scoring is False
    assert not health.healthy
    assert asyncio.run(committed_offsets(kafka_broker.bootstrap, group)).get((topic, 0), 0) == 0


async def _until(condition: Callable[[], Any], what: str) -> None:
    """Poll `condition` (a plain or an async one; bounded by WAIT_S) while the event loop
    runs the service."""
    deadline = time.monotonic() + WAIT_S
    while not (await value if inspect.isawaitable(value := condition()) else value):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_S:.0f}s waiting for {what}")
        await asyncio.sleep(0.25)


@pytest.mark.kafka
def test_healthz_fails_while_partitions_are_held_and_not_fetched(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A stalled consumer: its scorer waits on an alert outbox that another connection holds
    locked, then a rebalance waits for the scorer to drain, so the consumer keeps its
    partition and fetches nothing. /healthz turns 503 once no fetch completed for
    fetch_stall_seconds (the liveness probe would restart the pod), and 200 again when
    the lock is gone and the rebalance ends."""
    topic, group = new_topic(kafka_broker, partitions=1)
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], delivery={"lock_timeout": "10m"})
    settings = ServeSettings(
        model={"dir": synthetic_model_dir, "threads": 1},
        kafka={
            "bootstrap_servers": kafka_broker.bootstrap, "topics": [topic], "group_id": group,
            "session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000,
        },
        sink={"kind": "alerts", "routes": routes},
        fetch_stall_seconds=2,
    )  # fmt: skip
    health = Health(model_loaded=True)
    sink = open_alert_sink(routes, deliver=False)
    server = serve_http("127.0.0.1", free_port(), health)
    holder = sqlite3.connect(tmp_path / "outbox.sqlite", isolation_level=None, timeout=60)

    async def stall_and_recover() -> None:
        service = Service(settings, Detector.load(synthetic_model_dir), sink, health)
        stop = asyncio.Event()
        running = asyncio.create_task(service.run(stop))
        await _until(lambda: health.ready, "partitions assigned")
        assert _probe(server) == 200
        holder.execute("BEGIN IMMEDIATE")  # the outbox's write lock, held elsewhere
        await produce(kafka_broker.bootstrap, topic, [(b"web-1", ODD_LINE.encode())] * 3)
        consumer, partition = service.source.consumer, TopicPartition(topic, 0)

        async def fetched() -> bool:  # the scorer has them: it waits on the lock from now on
            return await consumer.position(partition) >= 3

        await _until(fetched, "the odd lines fetched")
        rival = AIOKafkaConsumer(topic, group_id=group, bootstrap_servers=kafka_broker.bootstrap)
        await rival.start()  # joins the group: a rebalance, whose revoke waits for the scorer
        try:
            await _until(lambda: _probe(server) == 503, "/healthz 503 on the stalled consumer")
            holder.execute("ROLLBACK")
            await _until(lambda: _probe(server) == 200, "/healthz 200 once fetching resumed")
        finally:
            if holder.in_transaction:  # the test failed while the lock was held: let the scorer go
                holder.execute("ROLLBACK")
            await rival.stop()
            stop.set()
            await running

    try:
        asyncio.run(stall_and_recover())
    finally:
        holder.close()
        sink.close(grace=0)
        server.shutdown()
        server.server_close()


@pytest.mark.kafka
def test_verdicts_are_reread_while_no_line_comes(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A verdict given while the topic is quiet is in force before the next line comes: the
    scorer's idle tick re-reads the store every feedback.refresh_seconds, so the rules, their
    metrics and a locked database's recovery never wait for traffic."""
    topic, group = new_topic(kafka_broker, partitions=1)
    settings = ServeSettings(
        model={"dir": synthetic_model_dir, "threads": 1},
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "topics": [topic], "group_id": group},
        sink={"kind": "jsonl", "path": tmp_path / "anomalies.jsonl"},
        feedback={"database": tmp_path / "feedback.sqlite", "refresh_seconds": 0.5},
    )
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    detector = Detector.load(synthetic_model_dir, rules=FeedbackRules(store, refresh_seconds=0.5))
    sink = JsonlSink(tmp_path / "anomalies.jsonl")
    template = "<TS> <HOST> app: cache rebuilt"

    async def quiet_verdict() -> None:
        service = Service(settings, detector, sink, Health(model_loaded=True))
        stop = asyncio.Event()
        running = asyncio.create_task(service.run(stop))
        try:
            assert detector.rules is not None and detector.rules.verdict(template, "web-1") is None
            store.add(Feedback("normal", template, created_by="ops"))
            await _until(lambda: detector.rules.verdict(template, "web-1") == "normal", "the verdict read")
        finally:
            stop.set()
            await running

    try:
        asyncio.run(quiet_verdict())
    finally:
        sink.close()
        store.close()
    assert asyncio.run(end_offsets(kafka_broker.bootstrap, topic, [0])) == {0: 0}  # no line came
