"""`logstream serve` against a real Kafka broker: end to end, crash, rebalance, poison, restart.

Each test runs the real command in a subprocess (`python -m logstream.cli serve`),
produces with aiokafka, and reads what serve wrote: its sink, its audit log
(one line per scored line, written after the sink and before the commit), its
/metrics, and the group's committed offsets from the broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiokafka.errors import GroupCoordinatorNotAvailableError
from alerts_support import webhook, write_routes
from http_receivers import Receiver
from kafka_broker import (
    KafkaBroker,
    committed_offsets,
    create_topic,
    end_offsets,
    free_port,
    produce,
)
from prometheus_client.parser import text_string_to_metric_families
from quiet_support import START, after_restart, baseline_lines, stopped_job
from quiet_support import line as quiet_line

from logstream.consumers.inputs import parse_lines
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.records import Stream

pytestmark = pytest.mark.kafka
WAIT_S = 120.0  # bound on every wait below (model load + scoring on a busy 2-core machine)
ODD_LINE = "2026-11-02T09:00:00.000Z web-1 FATAL kernel: panic xq9 zz unknown opcode in module qwzx"


def normal_lines(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    """(key, value) messages: synthetic normal lines keyed by their host (their stream)."""
    return [
        (r.stream.encode(), r.line.encode())
        for r in parse_lines(generate_lines(n, seed=seed).lines, STREAM_KEY)
    ]


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `condition` until truthy (bounded); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a torn last line is skipped


class Serve:
    """A `logstream serve` subprocess with its own config, sink, audit log and port."""

    def __init__(
        self,
        tmp_path: Path,
        broker: KafkaBroker,
        model_dir: Path,
        topic: str,
        group: str,
        **extra: Any,
    ) -> None:
        name = uuid.uuid4().hex[:6]
        self.port = free_port()
        self.sink = tmp_path / f"anomalies-{name}.jsonl"
        self.audit = tmp_path / f"audit-{name}.jsonl"
        self.stderr_path = tmp_path / f"serve-{name}.log"
        config: dict[str, Any] = {
            "model": {"dir": str(model_dir), "threads": 1},
            "kafka": {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": group,
                "max_poll_records": 64,
                "session_timeout_ms": 10_000,
                "heartbeat_interval_ms": 1_000,
            },
            "sink": {"kind": "jsonl", "path": str(self.sink)},
            "http": {"host": "127.0.0.1", "port": self.port},
            "audit_log": str(self.audit),
            "log_format": "json",
            "shutdown_grace_seconds": 30,
        }
        for section, values in extra.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:
                config[section] = values
        self.config = tmp_path / f"serve-{name}.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Serve:
        with self.stderr_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logstream.cli", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=2.0)
        except httpx.HTTPError:
            return None

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.stderr_path.read_text()[-2000:]
            pytest.fail(f"serve exited with {self.process.returncode}: {tail}")
        response = self.get("/readyz")
        return response is not None and response.status_code == 200

    def metric(self, name: str, **labels: str) -> float:
        response = self.get("/metrics")
        assert response is not None and response.status_code == 200
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def terminate(self) -> int:
        """SIGTERM and wait (bounded) for the graceful exit; its code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=WAIT_S)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: no shutdown code runs
        self.process.wait(timeout=WAIT_S)

    def logs(self) -> list[dict[str, Any]]:
        lines = self.stderr_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def audited(self) -> set[tuple[str, int]]:
        return {(e["source"], e["offset"]) for e in read_jsonl(self.audit) if e["kind"] == "line"}


def fully_committed(broker: KafkaBroker, group: str, topic: str, partitions: int) -> bool:
    ends = asyncio.run(end_offsets(broker.bootstrap, topic, range(partitions)))
    try:
        committed = asyncio.run(committed_offsets(broker.bootstrap, group))
    except GroupCoordinatorNotAvailableError:  # the broker's offsets topic is still being set up
        return False
    return all(committed.get((topic, p), 0) >= end for p, end in ends.items())


def new_topic(broker: KafkaBroker, partitions: int) -> tuple[str, str]:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(broker.bootstrap, name, partitions))
    return name, f"group-{name}"


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
