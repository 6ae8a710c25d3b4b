"""`logstream serve` against a real Kafka broker, end to end: the anomaly with its stream,
offset and score; the alert through the outbox; topic patterns and readiness; idle streams;
quiet sources; resident streams; bad configs; multi-line events.

Each test runs the real command in a subprocess (`python -m logstream.cli serve`,
tests/serve_support.py), produces with aiokafka, and reads what serve wrote: its sink, its audit
log (one line per scored line, written after the sink and before the commit), its /metrics, and
the group's committed offsets from the broker. Crashes, rebalances, poison and broker restarts
are in tests/test_serve_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from alerts_support import webhook, write_routes
from http_receivers import Receiver
from kafka_broker import KafkaBroker, create_topic, free_port, produce
from quiet_support import START, after_restart, baseline_lines, stopped_job
from quiet_support import line as quiet_line
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

from logstream.lifecycle.train import TrainConfig, save, train
from logstream.records import Stream

pytestmark = pytest.mark.kafka


def test_injected_anomaly_comes_out_with_stream_offset_and_score(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """An odd line produced among normal ones is reported with its stream, offset and score."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = normal_lines(80, seed=11)
    messages.insert(60, (b"web-1", ODD_LINE.encode()))
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "all offsets committed")
    assert serve.terminate() == 0
    found = [a for a in read_jsonl(serve.sink) if a["line"] == ODD_LINE]
    assert len(found) == 1
    anomaly = found[0]
    assert anomaly["stream"] == "web-1"
    assert (anomaly["source"], anomaly["offset"]) == (f"{topic}/0", placed[60][1])
    assert anomaly["score"] > anomaly["threshold"]
    assert len(serve.audited()) == len(messages)


def test_anomaly_reaches_an_alert_webhook_through_the_outbox(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With sink kind alerts, an odd line becomes a webhook POST on a real 127.0.0.1 receiver,
    carrying what on-call clicks first: the record's team label, topic/partition@offset, the
    stream's previous lines, the log's own time as startsAt, the model id and version, the
    template text and the configured link; and /metrics has the dashboard's new series."""
    topic, group = new_topic(kafka_broker, partitions=1)
    event_time = "2026-11-02T09:00:00.000Z"
    messages = [
        (key, json.dumps({"message": value.decode(), "host": key.decode(), "team": "storage"}).encode())
        for key, value in normal_lines(40, seed=19)
    ]
    odd = {"message": ODD_LINE, "host": "web-1", "team": "storage", "ts": event_time}
    messages.append((b"web-1", json.dumps(odd).encode()))
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    before = [json.loads(v)["message"] for k, v in messages[:-1] if k == b"web-1"][-2:]
    with Receiver() as receiver:
        routes = write_routes(
            tmp_path, [webhook("team", receiver.url)], record_labels=["team"],
            links=[{"name": "Logs", "url": "https://grafana.example/explore?stream={{stream}}&team={{labels.team}}"}],
        )  # fmt: skip
        serve = Serve(
            tmp_path,
            kafka_broker,
            synthetic_model_dir,
            topic,
            group,
            sink={"kind": "alerts", "routes": str(routes)},
            input={
                "format": "json", "stream_key": "json_field", "stream_field": "host",
                "label_fields": {"team": "team"}, "timestamp_field": "ts",
            },
        ).start()  # fmt: skip
        wait_for(serve.ready, "serve ready")
        wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
        found = wait_for(
            lambda: [r.body for r in receiver.ok() if ODD_LINE in json.dumps(r.body)], "the webhook call"
        )
        scored = serve.metric("logstream_line_score_count")
        threshold = serve.metric("logstream_threshold")
        streams = serve.metric("logstream_active_streams")
        build = serve.get("/metrics").text  # type: ignore[union-attr]
        assert serve.terminate() == 0
    alert = found[0]["alerts"][0]
    notes = alert["annotations"]
    assert alert["labels"]["team"] == "storage" and alert["labels"]["stream"] == "web-1"
    assert notes["source"] == f"{topic}/0@{placed[-1][1]}"
    assert notes["context_before"].splitlines() == before
    assert alert["startsAt"] == event_time
    assert notes["model_id"].startswith("model@") and notes["model_version"]
    assert "kernel: panic" in notes["template"]  # the template text, not its hash
    assert alert["generatorURL"] == "https://grafana.example/explore?stream=web-1&team=storage"
    assert scored == len(messages) and threshold > 0 and streams >= 1
    assert re.search(r'logstream_build_info\{model_id="model@[0-9a-f]*",version="[^"]+"\} 1\.0', build)


def test_topics_by_pattern_and_readiness_waits_for_partitions(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """/readyz is 503 (while /healthz is 200, model loaded) until a topic matching topic_pattern is assigned."""
    prefix = f"pat-{uuid.uuid4().hex[:8]}"
    group = f"group-{prefix}"
    serve = Serve(
        tmp_path,
        kafka_broker,
        synthetic_model_dir,
        "unused",
        group,
        kafka={"topics": [], "topic_pattern": f"{prefix}-.*", "metadata_max_age_ms": 1000},
    ).start()
    wait_for(lambda: getattr(serve.get("/healthz"), "status_code", None) == 200, "healthy (model loaded)")
    assert serve.get("/readyz").status_code == 503
    topic = f"{prefix}-app"
    asyncio.run(create_topic(kafka_broker.bootstrap, topic, 1))
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(20, seed=20)))
    wait_for(serve.ready, "ready once the new matching topic is assigned")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "the matching topic consumed")
    assert serve.terminate() == 0
    assert len(serve.audited()) == 20


def test_quiet_stream_is_closed_and_its_cache_freed(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With stream_idle_seconds, streams that went quiet are closed: the cache bytes fall to 0."""
    topic, group = new_topic(kafka_broker, partitions=1)
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, stream_idle_seconds=5.0).start()
    wait_for(serve.ready, "serve ready")
    asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(30, seed=21)))
    wait_for(lambda: serve.metric("logstream_lines_total") == 30, "the lines scored")
    assert serve.metric("logstream_cache_bytes") > 0  # the streams are live for 5 s more
    wait_for(lambda: serve.metric("logstream_cache_bytes") == 0, "the quiet streams closed")
    assert serve.terminate() == 0


def test_a_source_that_stops_logging_alerts_once(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A host's cron job stops while its app goes on logging: serve hands one quiet-source
    alert to the sink, at the offset of the line that showed it, and audits it as kind quiet."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = [(b"web-1", quiet_line(t, source).encode()) for t, source in stopped_job()]
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "all offsets committed")
    assert serve.metric("logstream_quiet_watched_sources") == 2  # web-1 cron and web-1 app
    assert serve.terminate() == 0
    quiet = [a for a in read_jsonl(serve.sink) if a["kind"] == "quiet"]
    assert [(a["stream"], a["template"]) for a in quiet] == [("web-1", "quiet source: web-1 cron")]
    shown_at = messages[[offset for _, offset in placed].index(quiet[0]["offset"])][1].decode()
    assert "web-1 app" in shown_at and quiet[0]["score"] > quiet[0]["threshold"]
    assert [e["kind"] for e in read_jsonl(serve.audit) if e["kind"] != "line"] == ["quiet"]
    off = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, f"{group}-off", quiet_sources=False
    ).start()
    wait_for(off.ready, "serve (quiet_sources: false) ready")
    wait_for(lambda: fully_committed(kafka_broker, f"{group}-off", topic, 1), "all offsets committed again")
    assert off.terminate() == 0
    assert len(off.audited()) == len(messages)
    assert [a for a in read_jsonl(off.sink) if a["kind"] == "quiet"] == []


def test_a_fresh_serve_judges_sources_by_the_models_rhythms(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A serve that just started (a deploy, a rebalance) has no gaps of its own: with a model
    trained on the host's logs, the cron job that runs once after the start and then stops is
    named, by the rhythm `train` kept with the model."""
    model = tmp_path / "model"
    config = TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4)
    save(train([Stream("web-1", baseline_lines())], config), model)
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = [(b"web-1", quiet_line(t, source).encode()) for t, source in after_restart(1, START + 86_400)]
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(tmp_path, kafka_broker, model, topic, group).start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "all offsets committed")
    assert serve.terminate() == 0
    quiet = [a for a in read_jsonl(serve.sink) if a["kind"] == "quiet"]
    assert [(a["stream"], a["template"]) for a in quiet] == [("web-1", "quiet source: web-1 cron")]


def test_model_max_streams_sets_the_engines_resident_streams(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """model.max_streams: 2 holds two streams' caches at most (the rest evicted, rescored
    from their tokens when they return), though the lines come from six streams."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = normal_lines(60, seed=22)
    assert len({key for key, _ in messages}) > 2
    serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, model={"max_streams": 2}).start()
    wait_for(serve.ready, "serve ready")
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    wait_for(lambda: serve.metric("logstream_lines_total") == len(messages), "the lines scored")
    # the gauge is set after the batch is handed off, a moment after the line counter
    wait_for(lambda: serve.metric("logstream_active_streams") == 2, "two resident streams")
    assert serve.terminate() == 0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"kafka": {"topics": []}},
            "kafka: set exactly one of kafka.topics and kafka.topic_pattern",
        ),
        (
            {"kafka": {"max_poll_records": -1}},
            "kafka.max_poll_records: Input should be greater than 0",
        ),
        ({"model": {"dir": "/nonexistent/model"}}, "/nonexistent/model"),
    ],
)
def test_bad_config_fails_at_start_with_one_line(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    """A wrong setting or model dir stops serve at start: exit 2 and one clear line."""
    config = {
        "model": {"dir": str(tmp_path / "model")},
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topics": ["logs"]},
        "http": {"host": "127.0.0.1", "port": free_port()},
    }
    for section, values in change.items():
        config[section].update(values)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGSTREAM_")}
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "serve", "--config", str(path)],
        capture_output=True,
        timeout=WAIT_S,
        env=env,
        cwd=tmp_path,  # relative default paths (the JSONL sink) land here, not in the repo
    )
    assert result.returncode == 2
    stderr = result.stderr.decode().strip()
    assert stderr.startswith("error: ")
    assert expected in stderr
    assert "Traceback" not in stderr


TRACE = [  # one Java exception, sent as one message per line (a shipper that does not join)
    "2026-11-02T09:00:05.000Z worker-1 ERROR job 8629: failed queue=batch",
    "java.lang.IllegalStateException: inventory service returned 503",
    "\tat com.example.orders.InventoryClient.reserve(InventoryClient.java:88)",
    "Caused by: java.net.SocketTimeoutException: Read timed out",
    "\t... 12 more",
]


def test_input_multiline_joins_a_trace_interleaved_with_other_streams(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With `input.multiline.mode: auto`, a trace sent one line per message, keyed by its
    stream and interleaved with other streams' messages, is scored as one record: the audit
    log holds its first message's offset and none of its other lines', the other streams'
    messages are scored each, and every offset is committed."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = [m for m in normal_lines(40, seed=12) if m[0] != b"worker-1"][:30]
    at = [10 + 2 * k for k in range(len(TRACE))]  # a message of another stream between each
    for k, line in zip(at, TRACE, strict=True):
        messages.insert(k, (b"worker-1", line.encode()))
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group, input={"multiline": {"mode": "auto"}}
    )
    serve.start()
    wait_for(serve.ready, "serve ready")
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "all offsets committed")
    assert serve.terminate() == 0
    audited = serve.audited()
    trace = [(f"{topic}/0", placed[k][1]) for k in at]
    assert trace[0] in audited and not set(trace[1:]) & audited
    assert len(audited) == len(messages) - (len(TRACE) - 1)
