"""Chaos run: does `logstream serve` lose a line or an alert when everything around it fails?

A real Kafka broker (KRaft, tests/kafka_broker.py; run .ci/kafka.sh first), a producer at a
steady rate, `logstream serve` subprocesses with the alerts sink, and a webhook receiver on
127.0.0.1 (tests/http_receivers.py). Serve follows a model store (`model.store`), keeps its
streams' state in a changelog topic (`state.changelog_topic`) and reads operator feedback
from a database of its own (`feedback.database`). While lines flow, at seeded random moments:

- `kill -9` of serve, then a restart with the same config, audit log and outbox (what a
  StatefulSet pod with its claim gets back);
- a broker restart (same ports and data);
- poison messages: undecodable bytes, an oversized message, empty values, bad JSON and JSON
  nested 30,000 deep;
- a receiver that fails a share of requests: 500, 429 with Retry-After, a hang past the
  client's timeout, a connection reset mid-response;
- anomalous lines, each on a stream of its own;
- poisoned changelog records: while serve is down after a kill, two records of the serving
  model for streams it held, one with token ids past the vocabulary, one claiming offset
  2**62; the restart must refuse both (their streams start cold) and fetch on;
- a broken model promoted: a store version whose config.json has no attention heads
  (benchmarks/faults.py), added and promoted as a library call would (no trial load); serve
  must keep scoring with the version it has, and restarts fall back to it;
- the feedback database locked by another process for a while (kills wait for the release:
  a serve that starts under the lock cannot open the database); scoring goes on with the
  rules read before, and the next refresh after the release recovers.

At the end (waits are bounded; nothing is timed) it counts, from the topic itself, serve's
audit log, the group's committed offsets, serve's metrics and log, and what the receiver
answered 2xx:

- lines: every non-poison message of the topic was scored at least once (re-scores after a
  kill are allowed: at-least-once), and committed;
- stalls: partitions whose committed offset never reached their end, and /healthz answers
  other than 200 from a serve that had answered 200 (a probe would have restarted it);
- anomalies: every stream with an audited anomaly got at least one firing alert answered 2xx
  (alerts group by stream and template, so a stream is the finest unit the audit log and the
  alerts share; each injected anomaly has a stream of its own, so for them it is exact);
- duplicate pages: idempotency keys answered 2xx more than once (the at-least-once window:
  a kill between the receiver's 2xx and the outbox's "delivered" re-sends, with the same key);
- poison: copies in the dead-letter topic;
- the faults' own counters, summed over every serve process (each is read before it is
  stopped): changelog restore failures by reason, model load failures, feedback refresh
  errors; and serve's log events for them.

    .venv/bin/python benchmarks/chaos.py [--seconds 180] [--rate 20] [--kills 6] [--seed 1] [--model DIR]

tests/benchmarks/test_chaos.py runs a short variant in CI. The last stdout line is the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402 - after the tests/ path insert, like the imports below
import yaml  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402
from faults import broken_copy, forged_states, locked  # noqa: E402
from http_receivers import Action, Drop, Received, Receiver, Reply  # noqa: E402
from kafka_broker import KafkaBroker, committed_offsets, create_topic, free_port, produce  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from logstream.detector import Detector  # noqa: E402
from logstream.evaluation.synth import STREAM_KEY, generate_lines  # noqa: E402
from logstream.lifecycle import model_store  # noqa: E402

WAIT_S = 180.0  # bound on each wait for serve (model load + catching up on a busy 2-core box)
CLIENT_TIMEOUT_S = 1.0  # the webhook's timeout; a "hang" answers later than this
ODD_LINE = "{ts} {host} FATAL kernel: panic xq9 zz unknown opcode {n} in module qwzx"
MAX_MESSAGE_BYTES = 65536
# store versions promoted mid-run, in turn: each fails serve's trial load a way of its own
PROMOTED_BREAKAGES = ("zero_heads", "hidden_size_doubled", "weights_nan")
# serve's counters of the faults, summed over its processes (`ServeProcess.bank`)
FAULT_COUNTERS = (
    "logstream_changelog_restore_failures_total",
    "logstream_restored_streams_total",
    "logstream_model_load_failures_total",
    "logstream_feedback_refresh_errors_total",
)
# serve's log events of the faults, counted in serve.log
FAULT_EVENTS = (
    "changelog_restore_failed",
    "model_reload_failed",
    "model_version_skipped",
    "feedback_refresh_failed",
    "feedback_refresh_recovered",
)


@dataclass(frozen=True)
class ChaosConfig:
    """One run. Times are seconds from the first produced line."""

    seconds: float = 180.0  # how long lines are produced
    rate: float = 20.0  # lines per second
    partitions: int = 2
    kills: int = 6  # kill -9 of serve (each followed by a restart)
    broker_restarts: int = 2
    poison: int = 20  # poison messages among the lines
    anomalies: int = 12  # injected anomalous lines, one stream each
    failure_rate: float = 0.3  # share of receiver answers that fail
    poisoned_restarts: int = 2  # kills whose restart finds two forged changelog records (<= kills)
    broken_promotes: int = 2  # broken store versions promoted (PROMOTED_BREAKAGES in turn)
    feedback_lock_s: float = 30.0  # how long the feedback database is held (0: never)
    seed: int = 1
    settle_s: float = 600.0  # bound on the wait for everything to be scored and delivered


@dataclass
class ChaosReport:
    """What the run found; `ok` when nothing was lost."""

    seconds: float = 0.0
    planned_messages: int = 0
    sent_messages: int = 0  # acknowledged by the broker (a failed producer invalidates the run)
    produced_lines: int = 0
    produced_poison: int = 0
    scored_lines: int = 0  # distinct (partition, offset) in the audit log
    rescored_lines: int = 0  # audit entries beyond the first per offset (at-least-once)
    lost_lines: int = 0
    committed_lines: int = 0  # lines below their partition's committed offset
    partitions_stalled: list[str] = field(default_factory=list)  # committed offset short of the end
    healthz_failures: list[str] = field(default_factory=list)  # non-200 from a serve that was healthy
    anomalies: int = 0  # distinct audited anomalies
    anomaly_streams: int = 0
    delivered_streams: int = 0
    lost_anomaly_streams: list[str] = field(default_factory=list)
    injected: int = 0
    injected_detected: int = 0
    injected_delivered: int = 0
    pages: int = 0  # requests answered 2xx
    duplicate_pages: int = 0  # idempotency keys answered 2xx more than once
    receiver_answers: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    kills: int = 0
    broker_restarts: int = 0
    serve_starts: int = 0
    forged_records: int = 0  # poisoned changelog records produced
    restore_failures: dict[str, int] = field(default_factory=dict)  # by reason, all serve processes
    restored_streams: int = 0
    broken_promotes: int = 0
    model_load_failures: int = 0  # all serve processes
    model_fallback: float = 0.0  # the last serve's logstream_model_fallback
    feedback_lock_seconds: float = 0.0
    feedback_refresh_errors: dict[str, int] = field(default_factory=dict)  # by kind, all processes
    fault_events: dict[str, int] = field(default_factory=dict)  # FAULT_EVENTS in serve's log
    unexpected_exits: list[str] = field(default_factory=list)  # serve exits nobody asked for
    settled: bool = False
    final_exit_code: int | None = None  # of the last serve, stopped with SIGTERM

    @property
    def ok(self) -> bool:
        return (
            self.settled
            and self.sent_messages == self.planned_messages
            and self.lost_lines == 0
            and self.committed_lines == self.produced_lines
            and not self.lost_anomaly_streams
            and not self.partitions_stalled
            and not self.healthz_failures
        )

    def summary(self) -> str:
        return (
            f"chaos: {self.seconds:.0f}s, {self.sent_messages}/{self.planned_messages} messages sent, "
            f"{self.kills} kill -9, {self.broker_restarts} broker restarts, "
            f"{self.serve_starts} serve starts, {len(self.unexpected_exits)} unexpected exits | "
            f"lines: {self.produced_lines} produced, {self.scored_lines} scored "
            f"(+{self.rescored_lines} re-scored), {self.committed_lines} committed, "
            f"{self.lost_lines} lost | partitions stalled: {len(self.partitions_stalled)}, "
            f"/healthz failures: {len(self.healthz_failures)} | "
            f"poison: {self.produced_poison} produced, {self.dead_letters} dead-lettered | "
            f"anomalies: {self.anomalies} on {self.anomaly_streams} streams, "
            f"{self.delivered_streams} streams paged, {len(self.lost_anomaly_streams)} lost; "
            f"injected {self.injected}, detected {self.injected_detected}, "
            f"paged {self.injected_delivered} | receiver: {self.pages} pages answered 2xx, "
            f"{self.duplicate_pages} duplicate, answers {dict(sorted(self.receiver_answers.items()))} | "
            f"changelog: {self.forged_records} forged records, restore failures "
            f"{self.restore_failures}, {self.restored_streams} streams restored | "
            f"model: {self.broken_promotes} broken promoted, {self.model_load_failures} load failures, "
            f"fallback {self.model_fallback:.0f} | feedback: locked {self.feedback_lock_seconds:.0f}s, "
            f"refresh errors {self.feedback_refresh_errors} | serve log {self.fault_events}"
        )


# -- the messages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes | None
    poison: bool = False


def poison_messages(rng: random.Random, count: int) -> list[Message]:
    """Bad input of every kind serve must count, dead-letter and step over."""
    kinds: list[Callable[[int], bytes | None]] = [
        lambda i: b"\xff\xfe\xfa not utf-8 " + str(i).encode(),
        lambda i: json.dumps({"message": "x" * MAX_MESSAGE_BYTES, "host": f"p{i}"}).encode(),
        lambda i: b"",
        lambda i: None,
        lambda i: f'{{"message": "unterminated {i}'.encode(),
        lambda i: b"[" * 30_000 + b"]" * 30_000,  # RecursionError in a naive parser
        lambda i: json.dumps({"msg": f"no message field {i}"}).encode(),
    ]
    return [
        Message(b"poison", kinds[i % len(kinds)](i), poison=True) for i in rng.sample(range(count), count)
    ]


def plan_messages(config: ChaosConfig, rng: random.Random) -> tuple[list[Message], list[str]]:
    """Every message in send order (JSON records; stream = host), and the injected streams."""
    total = int(config.seconds * config.rate)
    from logstream.consumers.inputs import parse_lines

    lines = generate_lines(total, seed=config.seed).lines
    messages = [
        Message(r.stream.encode(), json.dumps({"message": r.line, "host": r.stream}).encode())
        for r in parse_lines(lines, STREAM_KEY)
    ]
    injected = []
    for n, index in enumerate(sorted(rng.sample(range(total // 10, total), config.anomalies))):
        host = f"chaos-{n}"
        ts = lines[index].split(" ", 1)[0]
        line = ODD_LINE.format(ts=ts, host=host, n=n)
        messages[index] = Message(host.encode(), json.dumps({"message": line, "host": host}).encode())
        injected.append(host)
    for message in poison_messages(rng, config.poison):
        messages.insert(rng.randrange(len(messages)), message)
    return messages, injected


async def produce_steadily(
    bootstrap: str, topic: str, messages: list[Message], rate: float, stop: threading.Event
) -> int:
    """Send message i at start + i / rate; a failed send (broker restarting) is retried. Sent count."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=4 * MAX_MESSAGE_BYTES,
    )
    await producer.start()
    sent = 0
    try:
        start = time.monotonic()
        for i, message in enumerate(messages):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for _attempt in range(120):  # bounded: a broker restart takes seconds, not minutes
                if stop.is_set():
                    return sent
                try:
                    await asyncio.wait_for(
                        await producer.send(topic, message.value, key=message.key), timeout=30
                    )
                    sent += 1
                    break
                except (KafkaError, TimeoutError):
                    await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"message {i} could not be produced")
    finally:
        await producer.stop()
    return sent


# -- the receiver ------------------------------------------------------------------------------


def failing_script(rng: random.Random, failure_rate: float) -> Callable[[Received, int], Action]:
    """Seeded. The first attempt of each page fails, cycling through 500, 429 + Retry-After, a hang
    past the client's timeout and a reset (so each kind happens once four pages have come);
    later attempts fail with `failure_rate`, then 200."""
    lock = threading.Lock()
    failures: list[Action] = [
        Reply(500, body=b"boom"),
        Reply(429, headers={"Retry-After": "1"}, body=b"slow down"),
        Reply(503, delay=CLIENT_TIMEOUT_S + 1.5),  # answered after the client gave up
        Drop(),
    ]
    rng.shuffle(failures)
    first_attempts = 0

    def script(_request: Received, nth: int) -> Action:
        nonlocal first_attempts
        with lock:
            if nth == 1:
                first_attempts += 1
                return failures[(first_attempts - 1) % len(failures)]
            if rng.random() < failure_rate:
                return rng.choice(failures)
        return Reply()

    return script


# -- serve -------------------------------------------------------------------------------------


class ServeProcess:
    """`logstream serve` with one config, audit log, outbox and feedback database across
    restarts (a pod and its PVC), following the model store `store`."""

    def __init__(self, work: Path, bootstrap: str, store: Path, topic: str, receiver_url: str) -> None:
        self.work = work
        self.port = free_port()
        self.audit = work / "audit.jsonl"
        self.log_path = work / "serve.log"
        self.dead_letter_topic = f"{topic}-dead"
        self.changelog_topic = f"{topic}-changelog"
        self.group = f"group-{topic}"
        # a file of its own: the outbox keeps a connection open on its file, which would keep
        # another process from taking an exclusive lock (benchmarks/faults.py `locked`)
        self.feedback_db = work / "feedback.sqlite"
        routes = {
            "route": {
                "receiver": "oncall",
                "group_wait": "0s",
                "group_interval": "2s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "oncall", "webhook_configs": [{"url": receiver_url + "/hook", "timeout": "1s"}]}
            ],
            "delivery": {
                "outbox": str(work / "outbox.sqlite"),
                "backoff": {"base": "50ms", "factor": 2, "max": "1s", "jitter": 0.5},
                "min_retry_delay": "20ms",
                "poll_interval": "50ms",
                "shutdown_grace": "5s",
            },
        }
        (work / "alerts.yaml").write_text(yaml.safe_dump(routes), encoding="utf-8")
        config = {
            "model": {"store": str(store), "reload_seconds": 1, "threads": 1},
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "group_id": self.group,
                "max_poll_records": 64,
                "session_timeout_ms": 10_000,
                "heartbeat_interval_ms": 1_000,
                "dead_letter_topic": self.dead_letter_topic,
            },
            "input": {
                "format": "json",
                "message_field": "message",
                "stream_key": "json_field",
                "stream_field": "host",
                "max_message_bytes": MAX_MESSAGE_BYTES,
            },
            "sink": {"kind": "alerts", "routes": str(work / "alerts.yaml")},
            "http": {"host": "127.0.0.1", "port": self.port},
            "state": {
                "changelog_topic": self.changelog_topic,
                "changelog_interval_seconds": 1,
                "restore_timeout_seconds": 20,
            },
            "feedback": {"database": str(self.feedback_db), "refresh_seconds": 1},
            "audit_log": str(self.audit),
            "log_format": "json",
            "shutdown_grace_seconds": 30,
            "fetch_stall_seconds": 30,  # /healthz fails on a partition held this long unfetched
        }
        self.config = work / "serve.yaml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.unexpected_exits: list[str] = []
        self.counted: Counter[str] = Counter()  # FAULT_COUNTERS of the processes that ended
        self.model_fallback = 0.0
        self.healthz_failures: list[str] = []
        self._healthy = False  # this process answered /healthz 200 since it started
        self._lock = threading.Lock()  # `start` and the /healthz monitor's `probe`

    def start(self) -> None:
        with self.log_path.open("ab") as log, self._lock:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logstream.cli", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work,
            )
            self.starts += 1
            self._healthy = False

    def alive(self) -> bool:
        """True while running; an exit nobody asked for is recorded and serve is restarted
        (what Kubernetes does with a crashed container)."""
        assert self.process is not None
        code = self.process.poll()
        if code is None:
            return True
        tail = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
        self.unexpected_exits.append(f"rc {code}: " + " | ".join(tail)[-600:])
        if code == 2:  # a config or model error: restarting cannot heal it
            raise RuntimeError(f"serve refused to start: {tail[-1] if tail else code}")
        self.start()
        return False

    def ready(self) -> bool:
        if not self.alive():
            return False
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def probe(self) -> None:
        """One GET /healthz (the monitor thread). A serve answers 503 while it loads its model;
        once it answered 200, anything else is a failure (a liveness probe would restart it)."""
        start = self.starts
        try:
            status = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2.0).status_code
        except httpx.HTTPError:
            return  # down: killed or restarting
        with self._lock:
            if start != self.starts:
                return  # the answer of a process that is gone
            if status == 200:
                self._healthy = True
            elif self._healthy:
                self.healthz_failures.append(f"serve start {start}: /healthz {status}")

    def bank(self) -> None:
        """Before this process ends: add its FAULT_COUNTERS to the run's (a restarted serve
        counts from 0 again); keep its logstream_model_fallback."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5.0).text
        except httpx.HTTPError:
            return
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in FAULT_COUNTERS:
                    labels = "".join(f"{{{value}}}" for value in sample.labels.values())
                    self.counted[sample.name + labels] += int(sample.value)
                elif sample.name == "logstream_model_fallback":
                    self.model_fallback = sample.value

    def counter(self, name: str) -> dict[str, int]:
        """A banked counter by its label value ("" without labels)."""
        return {key[len(name) :].strip("{}"): n for key, n in self.counted.items() if key.startswith(name)}

    def log_events(self) -> dict[str, int]:
        """FAULT_EVENTS in serve's log (JSON lines; anything else there is skipped)."""
        found: Counter[str] = Counter()
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line).get("event") if line.startswith("{") else None
            except ValueError:
                continue
            if event in FAULT_EVENTS:
                found[event] += 1
        return {event: found[event] for event in FAULT_EVENTS}

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        assert self.process is not None
        self.bank()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT_S)

    def terminate(self) -> int:
        assert self.process is not None
        self.bank()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=WAIT_S)


def wait_until(condition: Callable[[], bool], timeout: float, poll: float = 0.5) -> bool:
    """Poll `condition` until true or `timeout` (bounded); its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


# -- counting ------------------------------------------------------------------------------------


def read_committed(bootstrap: str, group: str) -> dict[str, int]:
    """The group's committed offsets, "topic/partition" -> next offset; {} while the broker
    cannot say (restarting)."""
    try:
        found = asyncio.run(committed_offsets(bootstrap, group))
    except KafkaError:
        return {}
    return {f"{topic}/{partition}": offset for (topic, partition), offset in found.items()}


async def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], bytes | None]:
    """Every message of the topic, read to its end offsets: (source "topic/partition", offset) -> value."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        last = {tp: -1 for tp in tps}  # the highest offset read per partition
        out: dict[tuple[str, int], bytes | None] = {}
        for _ in range(600):  # bounded: at most 600 fetches of up to 1 s
            if all(last[tp] >= ends[tp] - 1 for tp in tps):
                return out
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            for tp, records in batch.items():
                for record in records:
                    out[(f"{tp.topic}/{tp.partition}", record.offset)] = record.value
                    last[tp] = max(last[tp], record.offset)
        raise RuntimeError(f"{topic} not read to its end offsets {ends} (at {last})")
    finally:
        await consumer.stop()


def read_audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a torn last line (kill -9)


def is_poison(value: bytes | None) -> bool:
    """The poison messages of `poison_messages`, recognised in the topic."""
    if not value or len(value) > MAX_MESSAGE_BYTES or value.startswith((b"\xff", b"[")):
        return True
    try:
        record = json.loads(value)
    except ValueError:
        return True
    return not isinstance(record, dict) or "message" not in record


def count(
    report: ChaosReport,
    topic_messages: dict[tuple[str, int], bytes | None],
    audit: list[dict[str, Any]],
    committed: dict[str, int],
    receiver: Receiver,
    injected: list[str],
) -> None:
    """Fill the report's counts from the topic, the audit log, the group's committed offsets
    ("topic/partition" -> next offset) and the receiver's records."""
    lines = {pos for pos, value in topic_messages.items() if not is_poison(value)}
    report.produced_lines = len(lines)
    report.produced_poison = len(topic_messages) - len(lines)
    scored = [(e["source"], e["offset"]) for e in audit if e["kind"] == "line"]
    report.scored_lines = len(set(scored) & lines)
    report.rescored_lines = len(scored) - len(set(scored))
    report.lost_lines = len(lines - set(scored))
    report.committed_lines = sum(1 for source, offset in lines if offset < committed.get(source, 0))
    ends: dict[str, int] = {}
    for source, offset in topic_messages:
        ends[source] = max(ends.get(source, 0), offset + 1)
    report.partitions_stalled = sorted(s for s, end in ends.items() if committed.get(s, 0) < end)
    anomalies = {(e["source"], e["offset"]): e["stream"] for e in audit if e["anomaly"]}
    streams = set(anomalies.values())
    report.anomalies = len(anomalies)
    report.anomaly_streams = len(streams)
    delivered = receiver.ok()
    paged = {
        alert["labels"].get("stream", "")
        for request in delivered
        for alert in (request.body or {}).get("alerts", [])
        if alert.get("status") == "firing"
    }
    report.delivered_streams = len(streams & paged)
    report.lost_anomaly_streams = sorted(streams - paged)
    report.injected = len(injected)
    report.injected_detected = len(set(injected) & streams)
    report.injected_delivered = len(set(injected) & streams & paged)
    report.pages = len(delivered)
    keys = Counter(request.key for request in delivered)
    report.duplicate_pages = sum(1 for n in keys.values() if n > 1)
    report.receiver_answers = dict(Counter(request.answer for request in receiver.requests))


# -- the faults on the timeline ------------------------------------------------------------------


def plan_events(config: ChaosConfig, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds into the run, event), sorted: each fault at a seeded random moment."""
    return sorted(
        [(rng.uniform(0.1, 0.9) * config.seconds, "kill") for _ in range(config.kills)]
        + [(rng.uniform(0.2, 0.8) * config.seconds, "broker") for _ in range(config.broker_restarts)]
        + [(rng.uniform(0.2, 0.7) * config.seconds, "promote") for _ in range(config.broken_promotes)]
        + ([(rng.uniform(0.2, 0.6) * config.seconds, "lock")] if config.feedback_lock_s > 0 else [])
    )


class Faults:
    """The events of `plan_events` against one serve, its broker, model store and databases."""

    def __init__(
        self,
        config: ChaosConfig,
        broker: KafkaBroker,
        serve: ServeProcess,
        store: Path,
        model: Path,
        report: ChaosReport,
        rng: random.Random,
    ) -> None:
        self.config, self.broker, self.serve, self.store, self.model = config, broker, serve, store, model
        self.report, self.rng = report, rng
        self.poisonings = config.poisoned_restarts
        self.lock_holder: threading.Thread | None = None
        serving = Detector.load(model_store.live_dir(store))  # forged records must be of this model
        self.model_id, self.vocab_size = serving.model_id, serving.engine.vocab_size

    def kill(self) -> None:
        """kill -9 of a serving process, then a restart; the first `poisoned_restarts` restarts
        find forged changelog records, sent while serve was down. It waits for a held feedback
        lock's release and serve's recovery from it: a process killed before it logs the
        recovery takes its failing refreshes along, and its restart has none to recover from."""
        self.release_feedback()
        wait_until(self.serve.ready, WAIT_S)  # kill a serving process, not one still loading
        self.serve.kill()
        self.report.kills += 1
        if self.poisonings > 0 and self.poison_changelog():
            self.poisonings -= 1
        time.sleep(self.rng.uniform(0.0, 2.0))
        self.serve.start()

    def poison_changelog(self) -> bool:
        """Forged records (benchmarks/faults.py) for the two streams with the most audited
        lines, the latest of their keys: the restart reads them when it is assigned their
        partitions. False while fewer than two streams were scored."""
        audit = read_audit(self.serve.audit)
        held = Counter((e["stream"], e["source"]) for e in audit if e["kind"] == "line")
        streams = [stream for stream, _ in held.most_common(2)]
        if len(streams) < 2:
            return False
        for state in forged_states(self.model_id, self.vocab_size, streams):
            # the changelog partition of an input partition (serve made the topic like its input)
            partition = int(state.source.rsplit("/", 1)[1]) % self.config.partitions
            record = [(state.stream.encode(), state.encode())]
            asyncio.run(produce(self.broker.bootstrap, self.serve.changelog_topic, record, partition))
            self.report.forged_records += 1
        return True

    def restart_broker(self) -> None:
        self.broker.restart()
        self.report.broker_restarts += 1

    def promote_broken(self) -> None:
        """A broken version (PROMOTED_BREAKAGES in turn) added and promoted with the library
        calls, which do no trial load; waits (bounded) for serve's `model_reload_failed`."""
        n = self.report.broken_promotes
        wait_until(self.serve.ready, WAIT_S)  # a serve that follows the store, not one loading
        failed = self.serve.log_events()["model_reload_failed"]
        breakage = PROMOTED_BREAKAGES[n % len(PROMOTED_BREAKAGES)]
        broken = broken_copy(self.model, self.store.parent / f"broken-{n}", breakage)
        model_store.promote(self.store, model_store.add(self.store, broken, comment=breakage))
        self.report.broken_promotes += 1
        wait_until(lambda: self.serve.log_events()["model_reload_failed"] > failed, WAIT_S)

    def lock_feedback(self) -> None:
        """The feedback database held by another process for `feedback_lock_s`, on a thread of
        its own: the other faults go on meanwhile, kills wait for the release."""
        wait_until(self.serve.ready, WAIT_S)  # serve created the feedback table
        self.lock_holder = threading.Thread(target=self._hold_feedback, name="chaos-feedback-lock")
        self.lock_holder.start()

    def _hold_feedback(self) -> None:
        recovered = self.serve.log_events()["feedback_refresh_recovered"]
        started = time.monotonic()
        with locked(self.serve.feedback_db):
            time.sleep(self.config.feedback_lock_s)
        self.report.feedback_lock_seconds = time.monotonic() - started
        # the next refresh reads the database again; a kill before it would hide whether it can
        wait_until(lambda: self.serve.log_events()["feedback_refresh_recovered"] > recovered, 30.0)

    def release_feedback(self) -> None:
        """Wait (bounded) for the feedback lock's release and serve's recovery, if held."""
        if self.lock_holder is not None:
            self.lock_holder.join(timeout=self.config.feedback_lock_s + WAIT_S)


def watch_health(serve: ServeProcess, stop: threading.Event) -> None:
    """GET /healthz every second until `stop` (ServeProcess.probe)."""
    while not stop.wait(1.0):
        serve.probe()


# -- the run -------------------------------------------------------------------------------------


def run_chaos(config: ChaosConfig, broker: KafkaBroker, model: Path, work: Path, topic: str) -> ChaosReport:
    """One chaos run against `broker` with the model directory `model` (promoted in a model
    store under `work`); see the module docstring."""
    rng = random.Random(config.seed)
    report = ChaosReport()
    started = time.monotonic()
    asyncio.run(create_topic(broker.bootstrap, topic, config.partitions))
    asyncio.run(create_topic(broker.bootstrap, f"{topic}-dead", 1))
    messages, injected = plan_messages(config, rng)
    report.planned_messages = len(messages)
    events = plan_events(config, rng)
    store = work / "store"
    model_store.promote(store, model_store.add(store, model))
    stop, healthy_watch = threading.Event(), threading.Event()
    with Receiver(failing_script(random.Random(config.seed + 1), config.failure_rate)) as receiver:
        serve = ServeProcess(work, broker.bootstrap, store, topic, receiver.url)
        faults = Faults(config, broker, serve, store, model, report, rng)
        actions: dict[str, Callable[[], None]] = {
            "kill": faults.kill,
            "broker": faults.restart_broker,
            "promote": faults.promote_broken,
            "lock": faults.lock_feedback,
        }
        serve.start()
        if not wait_until(serve.ready, WAIT_S):
            raise RuntimeError(f"serve not ready after {WAIT_S:.0f}s; see {serve.log_path}")
        watcher = threading.Thread(target=watch_health, args=(serve, healthy_watch), name="chaos-healthz")
        watcher.start()
        produced: list[int] = []
        producer = threading.Thread(
            target=lambda: produced.append(
                asyncio.run(produce_steadily(broker.bootstrap, topic, messages, config.rate, stop))
            ),
            name="chaos-producer",
        )
        t0 = time.monotonic()
        producer.start()
        try:
            for at, event in events:
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                actions[event]()
            producer.join(timeout=config.seconds + WAIT_S)
        finally:
            stop.set()
            producer.join(timeout=WAIT_S)
            faults.release_feedback()

        def settled() -> bool:
            serve.alive()
            topic_messages = asyncio.run(read_topic(broker.bootstrap, topic, config.partitions))
            committed = read_committed(broker.bootstrap, serve.group)
            count(report, topic_messages, read_audit(serve.audit), committed, receiver, injected)
            everything_sent = len(topic_messages) >= report.planned_messages
            return (
                everything_sent
                and report.lost_lines == 0
                and not report.lost_anomaly_streams
                and not report.partitions_stalled
            )

        try:
            report.sent_messages = produced[0] if produced else 0
            report.settled = wait_until(settled, config.settle_s, poll=2.0)
        finally:
            healthy_watch.set()
            watcher.join(timeout=WAIT_S)
        report.final_exit_code = serve.terminate()
        report.serve_starts = serve.starts
        report.unexpected_exits = serve.unexpected_exits
        report.healthz_failures = serve.healthz_failures
        report.restore_failures = serve.counter("logstream_changelog_restore_failures_total")
        report.restored_streams = sum(serve.counter("logstream_restored_streams_total").values())
        report.model_load_failures = sum(serve.counter("logstream_model_load_failures_total").values())
        report.model_fallback = serve.model_fallback
        report.feedback_refresh_errors = serve.counter("logstream_feedback_refresh_errors_total")
        report.fault_events = serve.log_events()
        topic_messages = asyncio.run(read_topic(broker.bootstrap, topic, config.partitions))
        committed = read_committed(broker.bootstrap, serve.group)
        count(report, topic_messages, read_audit(serve.audit), committed, receiver, injected)
        dead = asyncio.run(read_topic(broker.bootstrap, f"{topic}-dead", 1))
        report.dead_letters = len(dead)
    report.seconds = time.monotonic() - started
    return report


def train_model(out: Path) -> Path:
    """The tests' synthetic model (tests/conftest.py): tiny, window 128, about a minute on 2 cores."""
    from logstream.consumers.inputs import streams_from_lines
    from logstream.lifecycle.train import TrainConfig, save, train

    streams = streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY)
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=1000, batch_size=16)
    save(train(streams, config), out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = ChaosConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument(
        "--model", type=Path, default=None, help="a model dir (default: train the tests' one)"
    )
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # reconnect noise while the broker restarts
    config = ChaosConfig(**{name: getattr(args, name) for name in asdict(defaults)})
    with tempfile.TemporaryDirectory(prefix="logstream-chaos-") as tmp:
        work = Path(tmp)
        model = args.model or train_model(work / "model")
        broker = KafkaBroker(work / "kafka")
        broker.start()
        try:
            (work / "serve").mkdir()
            report = run_chaos(config, broker, model, work / "serve", "chaos-logs")
        finally:
            broker.stop()
    print(report.summary())
    for exit_line in report.unexpected_exits:
        print(f"unexpected serve exit: {exit_line}")
    print(json.dumps({**asdict(report), "ok": report.ok, "config": asdict(config)}))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
