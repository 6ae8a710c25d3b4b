"""A real Apache Kafka broker for the tests and the Kafka benchmarks: KRaft, single node, on free
loopback ports.

The jars come from Maven Central (`.ci/kafka.sh` resolves them into
`.cache/kafka/libs`). `KafkaBroker` formats a scratch log dir, runs
`kafka.Kafka` in its own process group, waits (bounded) until it answers
metadata requests, and stops it with SIGTERM, then SIGKILL. `restart()` keeps
the data and the ports, so clients see the same broker come back.

The async helpers below (topics, produce, offsets) use aiokafka against the
broker directly: nothing sits between the client and the broker.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / ".cache" / "kafka" / "libs"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

_LOG4J = """\
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
"""


class BrokerError(RuntimeError):
    """The broker could not be started or stopped within its bounded wait."""


def jars_present() -> bool:
    return any(LIBS.glob("kafka_2.13-*.jar"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_group(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM a service started in its own process group, SIGKILL it if it does not exit
    within `timeout` seconds; nothing if it is not running."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)


class KafkaBroker:
    """One KRaft node (broker + controller) whose data lives under `work_dir`."""

    def __init__(self, work_dir: Path, cluster_id: str | None = None) -> None:
        self.work_dir = work_dir
        # a KRaft cluster id: 16 random bytes, URL-safe base64 without padding
        self.cluster_id = cluster_id or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = work_dir / "broker.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._java = ["java", "-Xms256m", "-Xmx768m", "-cp", f"{LIBS}/*"]

    def write_config(self) -> Path:
        """Write server.properties (and log4j2.properties); format the log dir if it is new."""
        data = self.work_dir / "data"
        config = self.work_dir / "server.properties"
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                ]
            )
            + "\n"
        )
        (self.work_dir / "log4j2.properties").write_text(_LOG4J)
        if not (data / "meta.properties").exists():
            format_cmd = [*self._java, "kafka.tools.StorageTool", "format"]
            formatted = subprocess.run(
                # `--cluster-id=ID`, not `-t ID`: one id in 64 starts with "-", which the
                # argument parser takes for an option
                [*format_cmd, f"--cluster-id={self.cluster_id}", "-c", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if formatted.returncode != 0:  # say why: CI shows the message, not the tool's output
                raise BrokerError(f"kafka-storage format failed: {formatted.stderr.strip()[-500:]}")
        return config

    def start(self) -> None:
        """Start the broker and wait until it serves metadata; BrokerError after the timeout."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        log4j = f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}"
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [*self._java[:3], log4j, *self._java[3:], "kafka.Kafka", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerError(f"broker exited with {self._process.returncode}; see {self.log_path}")
            if asyncio.run(_answers_metadata(self.bootstrap)):
                return
            time.sleep(0.5)
        self.stop()
        raise BrokerError(f"broker not ready after {START_TIMEOUT_S:.0f}s; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM the broker (a controlled shutdown), SIGKILL it if it does not exit in time."""
        process, self._process = self._process, None
        stop_process_group(process, STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data."""
        self.stop()
        self.start()


async def _answers_metadata(bootstrap: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await asyncio.wait_for(admin.start(), timeout=5)
        await asyncio.wait_for(admin.list_topics(), timeout=5)
        return True
    except Exception:
        return False
    finally:
        await admin.close()


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create a topic and wait (bounded) until every partition has a leader."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for _ in range(100):
            found = await producer.partitions_for(name)
            if found and len(found) == partitions:
                return
            await asyncio.sleep(0.1)
        raise BrokerError(f"topic {name} has no leaders after 10s")
    finally:
        await producer.stop()


async def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes | None]],
    partition: int | None = None,
) -> list[tuple[int, int]]:
    """Send (key, value) messages, acks=all; return each one's (partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key, partition=partition) for key, value in messages]
        metadata = [await future for future in futures]
    finally:
        await producer.stop()
    return [(m.partition, m.offset) for m in metadata]


async def committed_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets: (topic, partition) -> next offset to read."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}


async def end_offsets(bootstrap: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """The topic's end offsets (the next offset a producer will write) per partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        found = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in found.items()}
