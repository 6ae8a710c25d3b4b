"""Chaos run: does `logstream serve` lose a line or an alert when everything around it fails?

A real Kafka broker (KRaft, tests/kafka_broker.py; run .ci/kafka.sh first), a producer at a
steady rate, `logstream serve` subprocesses with the alerts sink, and a webhook receiver on
127.0.0.1 (tests/http_receivers.py). While lines flow, at seeded random moments:

- `kill -9` of serve, then a restart with the same config, audit log and outbox (what a
  StatefulSet pod with its claim gets back);
- a broker restart (same ports and data);
- poison messages: undecodable bytes, an oversized message, empty values, bad JSON and JSON
  nested 30,000 deep (issue 11, H1);
- a receiver that fails a share of requests: 500, 429 with Retry-After, a hang past the
  client's timeout, a connection reset mid-response;
- anomalous lines, each on a stream of its own.

At the end (waits are bounded; nothing is timed) it counts, from the topic itself, serve's
audit log and what the receiver answered 2xx:

- lines: every non-poison message of the topic was scored at least once (re-scores after a
  kill are allowed: at-least-once);
- anomalies: every stream with an audited anomaly got at least one firing alert answered 2xx
  (alerts group by stream and template, so a stream is the finest unit the audit log and the
  alerts share; each injected anomaly has a stream of its own, so for them it is exact);
- duplicate pages: idempotency keys answered 2xx more than once (the at-least-once window:
  a kill between the receiver's 2xx and the outbox's "delivered" re-sends, with the same key);
- poison: copies in the dead-letter topic.

    .venv/bin/python benchmarks/chaos.py [--seconds 180] [--rate 20] [--kills 6] [--seed 1] [--model DIR]

tests/test_chaos.py runs a short variant in CI. The last stdout line is the report as JSON.
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
from http_receivers import Action, Drop, Received, Receiver, Reply  # noqa: E402
from kafka_broker import KafkaBroker, create_topic, free_port  # noqa: E402

from logstream.synth import STREAM_KEY, generate_lines  # noqa: E402

WAIT_S = 180.0  # bound on each wait for serve (model load + catching up on a busy 2-core box)
CLIENT_TIMEOUT_S = 1.0  # the webhook's timeout; a "hang" answers later than this
ODD_LINE = "{ts} {host} FATAL kernel: panic xq9 zz unknown opcode {n} in module qwzx"
MAX_MESSAGE_BYTES = 65536


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
    unexpected_exits: list[str] = field(default_factory=list)  # serve exits nobody asked for
    settled: bool = False
    final_exit_code: int | None = None  # of the last serve, stopped with SIGTERM

    @property
    def ok(self) -> bool:
        return (
            self.settled
            and self.sent_messages == self.planned_messages
            and self.lost_lines == 0
            and not self.lost_anomaly_streams
        )

    def summary(self) -> str:
        return (
            f"chaos: {self.seconds:.0f}s, {self.sent_messages}/{self.planned_messages} messages sent, "
            f"{self.kills} kill -9, {self.broker_restarts} broker restarts, "
            f"{self.serve_starts} serve starts, {len(self.unexpected_exits)} unexpected exits | "
            f"lines: {self.produced_lines} produced, {self.scored_lines} scored "
            f"(+{self.rescored_lines} re-scored), {self.lost_lines} lost | "
            f"poison: {self.produced_poison} produced, {self.dead_letters} dead-lettered | "
            f"anomalies: {self.anomalies} on {self.anomaly_streams} streams, "
            f"{self.delivered_streams} streams paged, {len(self.lost_anomaly_streams)} lost; "
            f"injected {self.injected}, detected {self.injected_detected}, "
            f"paged {self.injected_delivered} | receiver: {self.pages} pages answered 2xx, "
            f"{self.duplicate_pages} duplicate, answers {dict(sorted(self.receiver_answers.items()))}"
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
        lambda i: b"[" * 30_000 + b"]" * 30_000,  # H1: RecursionError in a naive parser
        lambda i: json.dumps({"msg": f"no message field {i}"}).encode(),
    ]
    return [
        Message(b"poison", kinds[i % len(kinds)](i), poison=True) for i in rng.sample(range(count), count)
    ]


def plan_messages(config: ChaosConfig, rng: random.Random) -> tuple[list[Message], list[str]]:
    """Every message in send order (JSON records; stream = host), and the injected streams."""
    total = int(config.seconds * config.rate)
    from logstream.inputs import parse_lines

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
    """Seeded. The first attempt of each page fails, going round 500, 429 + Retry-After, a hang
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
    """`logstream serve` with one config, audit log and outbox across restarts (a pod and its PVC)."""

    def __init__(self, work: Path, bootstrap: str, model: Path, topic: str, receiver_url: str) -> None:
        self.work = work
        self.port = free_port()
        self.audit = work / "audit.jsonl"
        self.log_path = work / "serve.log"
        self.dead_letter_topic = f"{topic}-dead"
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
            "model": {"dir": str(model), "threads": 1},
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "group_id": f"group-{topic}",
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
            "audit_log": str(self.audit),
            "log_format": "json",
            "shutdown_grace_seconds": 30,
        }
        self.config = work / "serve.yaml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.unexpected_exits: list[str] = []

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logstream.cli", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work,
            )
        self.starts += 1

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

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT_S)

    def terminate(self) -> int:
        assert self.process is not None
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
    receiver: Receiver,
    injected: list[str],
) -> None:
    """Fill the report's counts from the topic, the audit log and the receiver's records."""
    lines = {pos for pos, value in topic_messages.items() if not is_poison(value)}
    report.produced_lines = len(lines)
    report.produced_poison = len(topic_messages) - len(lines)
    scored = [(e["source"], e["offset"]) for e in audit if e["kind"] == "line"]
    report.scored_lines = len(set(scored) & lines)
    report.rescored_lines = len(scored) - len(set(scored))
    report.lost_lines = len(lines - set(scored))
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


# -- the run -------------------------------------------------------------------------------------


def run_chaos(config: ChaosConfig, broker: KafkaBroker, model: Path, work: Path, topic: str) -> ChaosReport:
    """One chaos run against `broker` with the model directory `model`; see the module docstring."""
    rng = random.Random(config.seed)
    report = ChaosReport()
    started = time.monotonic()
    asyncio.run(create_topic(broker.bootstrap, topic, config.partitions))
    asyncio.run(create_topic(broker.bootstrap, f"{topic}-dead", 1))
    messages, injected = plan_messages(config, rng)
    report.planned_messages = len(messages)
    # (seconds into the run, event): kills and broker restarts at seeded random moments
    events = sorted(
        [(rng.uniform(0.1, 0.9) * config.seconds, "kill") for _ in range(config.kills)]
        + [(rng.uniform(0.2, 0.8) * config.seconds, "broker") for _ in range(config.broker_restarts)]
    )
    stop = threading.Event()
    with Receiver(failing_script(random.Random(config.seed + 1), config.failure_rate)) as receiver:
        serve = ServeProcess(work, broker.bootstrap, model, topic, receiver.url)
        serve.start()
        if not wait_until(serve.ready, WAIT_S):
            raise RuntimeError(f"serve not ready after {WAIT_S:.0f}s; see {serve.log_path}")
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
                if event == "kill":
                    wait_until(serve.ready, WAIT_S)  # kill a serving process, not one still loading
                    serve.kill()
                    report.kills += 1
                    time.sleep(rng.uniform(0.0, 2.0))
                    serve.start()
                else:
                    broker.restart()
                    report.broker_restarts += 1
            producer.join(timeout=config.seconds + WAIT_S)
        finally:
            stop.set()
            producer.join(timeout=WAIT_S)

        def settled() -> bool:
            serve.alive()
            topic_messages = asyncio.run(read_topic(broker.bootstrap, topic, config.partitions))
            count(report, topic_messages, read_audit(serve.audit), receiver, injected)
            everything_sent = len(topic_messages) >= report.planned_messages
            return everything_sent and report.lost_lines == 0 and not report.lost_anomaly_streams

        report.sent_messages = produced[0] if produced else 0
        report.settled = wait_until(settled, config.settle_s, poll=2.0)
        report.final_exit_code = serve.terminate()
        report.serve_starts = serve.starts
        report.unexpected_exits = serve.unexpected_exits
        topic_messages = asyncio.run(read_topic(broker.bootstrap, topic, config.partitions))
        count(report, topic_messages, read_audit(serve.audit), receiver, injected)
        dead = asyncio.run(read_topic(broker.bootstrap, f"{topic}-dead", 1))
        report.dead_letters = len(dead)
    report.seconds = time.monotonic() - started
    return report


def train_model(out: Path) -> Path:
    """The tests' synthetic model (tests/conftest.py): tiny, window 128, about a minute on 2 cores."""
    from logstream.inputs import streams_from_lines
    from logstream.train import TrainConfig, save, train

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
