"""The changelog on a real broker: a moved stream resumes with its context after a
rebalance, the changelog survives a kill -9, never behind the committed offsets, and a
poisoned record starts its stream cold without stalling the partition."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import GroupCoordinatorNotAvailableError
from kafka_broker import KafkaBroker, committed_offsets, create_topic, end_offsets, produce
from serve_support import (
    RESTORE_TOLERANCE,
    Serve,
    fully_committed,
    new_topic,
    normal_lines,
    read_jsonl,
    wait_for,
)

from logstream.detector import Detector
from logstream.kafka_state import StreamState

pytestmark = pytest.mark.kafka


def by_partition(messages: list[tuple[bytes, bytes]]) -> dict[int, list[tuple[bytes, bytes]]]:
    """Hosts web-* on partition 0, the others on 1: each stream on one partition."""
    out: dict[int, list[tuple[bytes, bytes]]] = {0: [], 1: []}
    for key, value in messages:
        out[0 if key.startswith(b"web-") else 1].append((key, value))
    return out


def produce_split(broker: KafkaBroker, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    for partition, part in by_partition(messages).items():
        asyncio.run(produce(broker.bootstrap, topic, part, partition=partition))


def scores(serve: Serve) -> dict[tuple[int, int], float]:
    """(partition, offset) -> surprisal of each line in the serve's audit log (the model's part
    of its score: what the restored context decides)."""
    return {
        (int(e["source"].rsplit("/", 1)[1]), e["offset"]): e["surprisal"]
        for e in read_jsonl(serve.audit)
        if e["kind"] == "line"
    }


def committed_now(broker: KafkaBroker, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets; {} while the broker's offsets topic is being set up."""
    try:
        return asyncio.run(committed_offsets(broker.bootstrap, group))
    except GroupCoordinatorNotAvailableError:
        return {}


def restored(serve: Serve) -> int:
    return sum(e.get("restored", 0) for e in serve.logs() if e.get("event") == "changelog_streams_restored")


def read_changelog(broker: KafkaBroker, topic: str, partitions: int) -> dict[str, StreamState]:
    """The latest state per stream in the changelog topic, read straight from the broker."""

    async def read() -> dict[str, StreamState]:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            latest: dict[str, bytes | None] = {}
            for _ in range(200):  # bounded: 200 fetches of up to 0.5 s
                if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                    break
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    for m in messages:
                        latest[m.key.decode()] = m.value
        finally:
            await consumer.stop()
        return {k: StreamState.decode(k, v) for k, v in latest.items() if v is not None}

    return asyncio.run(read())


def wait_split(first: Serve, second: Serve) -> None:
    """Until the group's two partitions are split one per replica."""
    wait_for(
        lambda: (
            first.metric("logstream_assigned_partitions")
            == 1
            == second.metric("logstream_assigned_partitions")
        ),
        "the partitions split 1 + 1",
    )


def test_moved_stream_resumes_with_its_context_after_a_rebalance(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """One serve scores the first half of two partitions; a second joins and takes one: the
    moved streams' next lines score as a serve that kept every stream does (within
    RESTORE_TOLERANCE), because the newcomer restored them from the changelog first."""
    messages = normal_lines(360, seed=31)
    first_half, second_half = messages[:240], messages[240:]
    reference_topic, reference_group = new_topic(kafka_broker, partitions=2)
    produce_split(kafka_broker, reference_topic, messages)
    reference = Serve(tmp_path, kafka_broker, synthetic_model_dir, reference_topic, reference_group).start()
    wait_for(lambda: fully_committed(kafka_broker, reference_group, reference_topic, 2), "the reference run")
    assert reference.terminate() == 0

    topic, group = new_topic(kafka_broker, partitions=2)
    state = {"changelog_topic": f"{topic}-changelog"}
    first = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, state=state).start()
    produce_split(kafka_broker, topic, first_half)
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 2), "the first half committed")
    second = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, state=state).start()
    wait_split(first, second)
    produce_split(kafka_broker, topic, second_half)
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 2), "the second half committed")
    assert first.terminate() == 0 and second.terminate() == 0

    moved = scores(second)
    assert moved and restored(second) >= 1
    want = scores(reference)
    diffs = [abs(score - want[where]) for where, score in moved.items()]
    assert max(diffs) <= RESTORE_TOLERANCE, sorted(diffs)[-5:]
    assert set(scores(first)) | set(moved) == set(want)  # every line scored, by one of them


def test_without_changelog_streams_of_lost_partitions_are_dropped(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Without a changelog, a replica that loses a partition drops its streams (cache and
    line count): were they to come back, they start cold and the cold-start policy applies,
    instead of scoring against a stale context. So after a split each stream's cache is held
    by one replica only."""
    messages = normal_lines(240, seed=32)
    streams = {key for key, _ in messages}
    topic, group = new_topic(kafka_broker, partitions=2)
    first = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    produce_split(kafka_broker, topic, messages[:120])
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 2), "the first half committed")
    assert first.metric("logstream_active_streams") == len(streams)
    second = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    wait_split(first, second)
    produce_split(kafka_broker, topic, messages[120:])
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 2), "the second half committed")
    wait_for(
        lambda: (
            first.metric("logstream_active_streams") + second.metric("logstream_active_streams")
            == len(streams)
        ),
        "each stream resident on one replica",
    )
    assert first.terminate() == 0 and second.terminate() == 0


def test_changelog_survives_kill_9_and_is_never_behind_the_committed_offsets(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """kill -9 once offsets are committed (mid-stream or at its end, however fast the serve
    ran): each stream's state in the changelog covers every line of it below its partition's
    committed offset; the restarted serve restores the streams from it and scores every line,
    the rest of the first batch and a second one produced after the kill."""
    topic, group = new_topic(kafka_broker, partitions=2)
    changelog = f"{topic}-changelog"
    messages = normal_lines(2000, seed=32)
    before_kill, after_kill = messages[:1200], messages[1200:]
    produce_split(kafka_broker, topic, before_kill)
    state = {"changelog_topic": changelog, "changelog_interval_seconds": 0.5}  # commits mid-stream
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, state=state)
    serve.start()
    wait_for(lambda: len(committed_now(kafka_broker, group)) == 2, "both partitions committed")
    serve.kill()
    committed = committed_now(kafka_broker, group)
    states = read_changelog(kafka_broker, changelog, 2)  # serve made it like the input: 2
    for partition, part in by_partition(before_kill).items():
        below = part[: committed.get((topic, partition), 0)]
        for stream in {key.decode() for key, _ in below}:
            last = max(i for i, (key, _) in enumerate(below) if key.decode() == stream)
            assert stream in states and states[stream].offset >= last + 1, (stream, partition)
    assert committed and states  # the kill came after state was written and offsets committed
    produce_split(kafka_broker, topic, after_kill)  # so the restarted serve always has lines to score
    serve.start()
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 2), "the restarted serve caught up")
    assert serve.terminate() == 0
    assert restored(serve) >= len(states)
    ends = asyncio.run(end_offsets(kafka_broker.bootstrap, topic, range(2)))
    assert {(f"{topic}/{p}", o) for p, end in ends.items() for o in range(end)} == serve.audited()


def test_poisoned_changelog_records_start_their_streams_cold_and_never_stall_the_partition(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """The changelog holds, for two streams of the partition, records of this very model that
    are forged: token ids past the vocabulary (the re-encoding inside the rebalance
    callback cannot take them) and an offset of 2**62 (taken as it is, every later line of its
    stream would look already scored). Serve counts both by reason, starts those streams cold, and fetches and
    scores every line of the partition."""
    topic, group = new_topic(kafka_broker, partitions=1)
    changelog = f"{topic}-changelog"
    asyncio.run(create_topic(kafka_broker.bootstrap, changelog, 1))
    messages = normal_lines(120, seed=33)
    first, second = sorted({key.decode() for key, _ in messages})[:2]
    detector = Detector.load(synthetic_model_dir)
    past_vocabulary = StreamState(
        first, detector.model_id, f"{topic}/0", 1, 1, 1.0, [5, detector.engine.vocab_size + 7]
    )
    past_the_end = StreamState(second, detector.model_id, f"{topic}/0", 2**62, 1, 1.0, [5, 6])
    poison = [(s.stream.encode(), s.encode()) for s in (past_vocabulary, past_the_end)]
    asyncio.run(produce(kafka_broker.bootstrap, changelog, poison, partition=0))
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group, state={"changelog_topic": changelog}
    )
    serve.start()
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "every line committed")
    failures = {
        reason: serve.metric("logstream_changelog_restore_failures_total", reason=reason)
        for reason in ("token_ids", "offset")
    }
    assert serve.terminate() == 0
    assert serve.audited() == {(f"{topic}/0", offset) for offset in range(len(messages))}
    assert failures == {"token_ids": 1, "offset": 1}
    assert restored(serve) == 0
