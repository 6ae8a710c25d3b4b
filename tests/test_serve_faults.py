"""`logstream serve` through faults on a real Kafka broker: a kill -9 and a restart, a
rebalance, poison messages, backpressure, a broker restart. No line is lost, no commit runs
ahead of the sink, and no partition stalls.

Each test runs the real command in a subprocess and reads what it wrote, as in
tests/test_serve.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from kafka_broker import KafkaBroker, committed_offsets, create_topic, end_offsets, produce
from serve_support import (
    ODD_LINE,
    WAIT_S,
    Serve,
    fully_committed,
    new_topic,
    normal_lines,
    read_jsonl,
    wait_for,
)

pytestmark = pytest.mark.kafka


def test_kill_9_then_restart_scores_every_line_and_commits_only_after_hand_off(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """kill -9 mid-stream + restart: every line is scored, no commit ever ran ahead of the sink.

    The kill lands wherever the serve has got to in the first batch (however fast it ran); a
    second batch produced after it keeps the restarted serve mid-stream.

    While serve runs, each observed committed offset C of a partition must be
    covered by the audit log (every offset below C scored, and the audit is
    written only after the sink's put returned), and every anomaly in the audit
    must already be in the sink.
    """
    topic, group = new_topic(kafka_broker, partitions=2)
    messages = normal_lines(1500, seed=12)
    messages[200] = (b"web-2", ODD_LINE.replace("web-1", "web-2").encode())
    before_kill, after_kill = messages[:700], messages[700:]
    asyncio.run(produce(kafka_broker.bootstrap, topic, before_kill))
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group)

    def commits_never_ahead_of_hand_off() -> None:
        committed = asyncio.run(committed_offsets(kafka_broker.bootstrap, group))
        audit = read_jsonl(serve.audit)  # read after the offsets: it can only have grown since
        scored = {(e["source"], e["offset"]) for e in audit}
        in_sink = {(a["source"], a["offset"]) for a in read_jsonl(serve.sink)}
        for (t, partition), offset in committed.items():
            missing = [o for o in range(offset) if (f"{t}/{partition}", o) not in scored]
            assert not missing, f"committed {offset} on {t}/{partition} before scoring {missing[:5]}"
        assert {(e["source"], e["offset"]) for e in audit if e["anomaly"]} <= in_sink

    serve.start()
    wait_for(lambda: len(serve.audited()) >= 100, "the first lines scored")
    commits_never_ahead_of_hand_off()
    serve.kill()
    commits_never_ahead_of_hand_off()
    asyncio.run(produce(kafka_broker.bootstrap, topic, after_kill))
    serve.start()
    deadline = time.monotonic() + WAIT_S
    while not fully_committed(kafka_broker, group, topic, 2):
        assert time.monotonic() < deadline, "restarted serve did not catch up"
        commits_never_ahead_of_hand_off()
        time.sleep(0.5)
    assert serve.terminate() == 0
    ends = asyncio.run(end_offsets(kafka_broker.bootstrap, topic, range(2)))
    produced = {(f"{topic}/{p}", o) for p, end in ends.items() for o in range(end)}
    assert produced == serve.audited()
    assert any(a["line"].endswith("module qwzx") for a in read_jsonl(serve.sink))


def test_rebalance_splits_partitions_and_survivor_takes_over(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Two members split 4 partitions; one leaves; the other takes all 4 and no line is lost."""
    topic, group = new_topic(kafka_broker, partitions=4)
    first = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    second = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    wait_for(lambda: first.ready() and second.ready(), "both members ready")
    wait_for(
        lambda: (
            first.metric("logstream_assigned_partitions")
            == 2
            == second.metric("logstream_assigned_partitions")
        ),
        "partitions split 2 + 2",
    )
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(120, seed=13)))
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 4), "first half committed")
    assert first.audited() and second.audited()
    assert second.terminate() == 0
    wait_for(lambda: first.metric("logstream_assigned_partitions") == 4, "survivor owns all 4")
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(120, seed=14)))
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 4), "second half committed")
    assert first.terminate() == 0
    ends = asyncio.run(end_offsets(kafka_broker.bootstrap, topic, range(4)))
    produced = {(f"{topic}/{p}", o) for p, end in ends.items() for o in range(end)}
    assert first.audited() | second.audited() == produced


def test_poison_messages_are_counted_logged_once_and_dead_lettered(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Bad messages never block the partition: counted per kind, logged once, dead-lettered."""
    topic, group = new_topic(kafka_broker, partitions=1)
    dead = f"{topic}-dead"
    asyncio.run(create_topic(kafka_broker.bootstrap, dead, 1))
    good = [
        (k, json.dumps({"message": v.decode(), "host": k.decode()}).encode()) for k, v in normal_lines(20, 15)
    ]
    poison: list[tuple[bytes | None, bytes | None]] = [
        (b"k", b"\xff\xfe\xfa not utf-8"),
        (b"k", json.dumps({"message": "x" * 600}).encode()),
        (b"k", b"{not json"),
        (b"k", b"{still not json"),
        (b"k", json.dumps({"msg": "no message field"}).encode()),
        (b"k", b""),
        (b"k", None),
    ]
    asyncio.run(produce(kafka_broker.bootstrap, topic, good[:10] + poison + good[10:]))
    serve = Serve(
        tmp_path,
        kafka_broker,
        synthetic_model_dir,
        topic,
        group,
        kafka={"dead_letter_topic": dead},
        input={
            "format": "json",
            "stream_key": "json_field",
            "stream_field": "host",
            "max_message_bytes": 512,
        },
    ).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
    counts = {
        kind: serve.metric("logstream_bad_records_total", kind=kind)
        for kind in ("undecodable", "oversized", "bad_json", "missing_field", "empty")
    }
    assert counts == {
        "undecodable": 1,
        "oversized": 1,
        "bad_json": 2,
        "missing_field": 1,
        "empty": 2,
    }
    assert serve.metric("logstream_dead_letters_total") == len(poison)
    assert serve.metric("logstream_lines_total") == len(good)
    assert serve.terminate() == 0
    logged = [e for e in serve.logs() if e.get("event") == "bad_record_skipped"]
    assert sorted(e["kind"] for e in logged) == sorted(counts)
    assert len(serve.audited()) == len(good)
    dead_ends = asyncio.run(end_offsets(kafka_broker.bootstrap, dead, [0]))
    assert dead_ends[0] == len(poison)


def test_backpressure_pauses_and_resumes_without_losing_lines(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Past max_inflight_lines the partitions pause, below half they resume; no line is lost."""
    topic, group = new_topic(kafka_broker, partitions=1)
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(150, seed=18)))
    serve = Serve(
        tmp_path,
        kafka_broker,
        synthetic_model_dir,
        topic,
        group,
        kafka={"max_poll_records": 16},
        max_inflight_lines=32,
    ).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
    assert serve.terminate() == 0
    events = [e.get("event") for e in serve.logs()]
    assert "backpressure_paused" in events
    assert "backpressure_resumed" in events
    assert len(serve.audited()) == 150


def test_consumer_resumes_after_broker_restart(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Serve survives a broker restart and scores and commits what is produced afterwards."""
    topic, group = new_topic(kafka_broker, partitions=1)
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(30, seed=16)))
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "first lines committed")
    kafka_broker.restart()
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(30, seed=17)))
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "lines after the restart committed")
    assert serve.process is not None and serve.process.poll() is None
    assert serve.terminate() == 0
    assert len(serve.audited()) == 60
