"""Stream affinity on a real broker: without repartitioning a stream spread over partitions
is counted and named; through the repartition stage every line of it reaches one scorer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kafka_broker import KafkaBroker, free_port, produce
from serve_support import WAIT_S, Serve, fully_committed, new_topic, normal_lines, read_jsonl, wait_for

pytestmark = pytest.mark.kafka
JSON_STREAM = {"format": "json", "stream_key": "json_field", "stream_field": "host"}


def spread(broker: KafkaBroker, topic: str, partitions: int, n: int, seed: int) -> dict[str, set[int]]:
    """Produce JSON lines with no key, round-robin over the partitions (a stream lands on all
    of them, as from a shipper that does not key by stream); each stream's partitions."""
    on: dict[str, set[int]] = {}
    parts: dict[int, list[tuple[bytes | None, bytes]]] = {p: [] for p in range(partitions)}
    for i, (key, value) in enumerate(normal_lines(n, seed=seed)):
        on.setdefault(key.decode(), set()).add(i % partitions)
        parts[i % partitions].append(
            (None, json.dumps({"message": value.decode(), "host": key.decode()}).encode())
        )
    for partition, messages in parts.items():
        asyncio.run(produce(broker.bootstrap, topic, messages, partition=partition))
    return on


def test_stream_on_several_partitions_is_counted_and_the_fix_named(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Consumed as is, streams spread over partitions are counted in
    logstream_split_streams_total and a warning names the fix (repartition.topic)."""
    topic, group = new_topic(kafka_broker, partitions=3)
    on = spread(kafka_broker, topic, 3, 90, seed=41)
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, input=JSON_STREAM).start()
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 3), "everything committed")
    split = serve.metric("logstream_split_streams_total")
    assert serve.terminate() == 0
    assert split == sum(len(partitions) > 1 for partitions in on.values()) > 0
    warnings = [e for e in serve.logs() if e.get("event") == "stream_split_across_partitions"]
    assert warnings and "repartition.topic" in warnings[0]["fix"]


def test_lines_of_a_stream_on_several_partitions_reach_one_scorer_through_repartitioning(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Two serves, each running the repartition stage in process: every stream's lines, spread
    over three raw partitions, are all scored by one of them, from one partition; none split."""
    raw, group = new_topic(kafka_broker, partitions=3)
    repartition = {"topic": f"{raw}-by-stream", "group_id": f"{group}-repartition", "partitions": 2}
    serves = [
        Serve(
            tmp_path,
            kafka_broker,
            synthetic_model_dir,
            raw,
            group,
            input=JSON_STREAM,
            repartition=repartition,
        )
        for _ in range(2)
    ]
    for serve in serves:
        serve.start()
    wait_for(  # produce once the scorers own a partition each: none moves while they score
        lambda: all(serve.ready() and serve.metric("logstream_assigned_partitions") == 1 for serve in serves),
        "the repartition topic's partitions split 1 + 1",
    )
    on = spread(kafka_broker, raw, 3, 150, seed=42)
    wait_for(lambda: fully_committed(kafka_broker, repartition["group_id"], raw, 3), "the raw topic copied")
    wait_for(lambda: fully_committed(kafka_broker, group, repartition["topic"], 2), "the copies scored")
    split = [serve.metric("logstream_split_streams_total") for serve in serves]
    assert all(serve.terminate() == 0 for serve in serves)
    assert split == [0, 0]
    scorers: dict[str, set[tuple[int, str]]] = {}
    for i, serve in enumerate(serves):
        for entry in read_jsonl(serve.audit):
            scorers.setdefault(entry["stream"], set()).add((i, entry["source"]))
    assert set(scorers) == set(on) and any(len(partitions) > 1 for partitions in on.values())
    assert all(len(where) == 1 for where in scorers.values()), scorers
    lines = sum(1 for serve in serves for e in read_jsonl(serve.audit) if e["kind"] == "line")
    assert lines >= 150  # every line; at-least-once: a copy may be scored twice


def test_repartition_role_alone_needs_a_topic(tmp_path: Path) -> None:
    """`logstream serve --role repartition` without repartition.topic: exit 2, one line."""
    config = {
        "model": {"dir": str(tmp_path)},
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topics": ["logs"]},
        "http": {"host": "127.0.0.1", "port": free_port()},
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGSTREAM_")}
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "serve", "--config", str(path), "--role", "repartition"],
        capture_output=True,
        timeout=WAIT_S,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "error: --role repartition needs repartition.topic"
