"""End-to-end lines/s through Kafka vs a file replay of the same lines, and lag under load.

Starts a real Kafka broker (support/kafka_broker.py; run .ci/kafka.sh first),
then, with one model:

1. replay: the lines from a file through `read_file` -> `Detector.score` ->
   JsonlSink on one worker thread, in batches of `--batch` (serve's max_poll_records);
2. kafka: `logstream serve` (a subprocess, started and ready beforehand) consumes
   the same lines produced at once; timed from the first send to the last commit.
   Steps 1 and 2 alternate `--reps` times; the ratio is of the medians;
3. lag: lines produced at a steady rate (a share of the replay rate) for
   `--lag-seconds`; the group's lag (end offset - committed) is sampled.

    .venv/bin/python benchmarks/kafka_throughput.py --lines 1000 --reps 3 [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# the broker, shared with the tests
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import httpx
import torch
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from kafka_broker import KafkaBroker, create_topic, free_port, produce

from logstream.alerts.sink import JsonlSink
from logstream.consumers.file import read_file
from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.detector import Detector
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.settings import InputSettings

TIMEOUT_S = 900.0


def train_model(out: Path) -> Path:
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=80)
    save(train(streams_from_lines(generate_lines(1500, seed=0).lines, STREAM_KEY), config), out)
    return out


def replay_rate(model: Path, log_file: Path, sink: Path, batch: int, worker: bool = True) -> float:
    """Lines/s of file -> parse -> score -> sink with one Detector (load not timed).

    `worker`: score on one worker thread, as serve does.
    """
    if worker:
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(replay_rate, model, log_file, sink, batch, False).result()
    detector = Detector.load(model)
    parser = RecordParser(InputSettings(stream_key="regex", stream_regex=STREAM_KEY))
    out = JsonlSink(sink)
    started, count, pending = time.perf_counter(), 0, []
    for record in read_file(log_file, parser, RejectLog()):
        pending.append(record)
        if len(pending) == batch:
            scored = detector.score(pending)
            out.put([a for s in scored if (a := detector.anomaly(s)) is not None])
            count, pending = count + len(pending), []
    if pending:
        scored = detector.score(pending)
        out.put([a for s in scored if (a := detector.anomaly(s)) is not None])
        count += len(pending)
    out.close()
    return count / (time.perf_counter() - started)


class LagProbe:
    """The group's lag on one partition, over long-lived clients (a cheap poll)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.group = group
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)

    async def __aenter__(self) -> LagProbe:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def lag(self, topic: str) -> int:
        tp = TopicPartition(topic, 0)
        end = (await self.consumer.end_offsets([tp]))[tp]
        committed = await self.admin.list_consumer_group_offsets(self.group, partitions=[tp])
        return end - max(committed[tp].offset, 0) if tp in committed else end

    async def drained(self, topic: str, poll_seconds: float = 0.02) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while await self.lag(topic) > 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {topic} to drain")
            await asyncio.sleep(poll_seconds)


def wait(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def start_serve(
    work: Path, broker: KafkaBroker, model: Path, topics: list[str], batch: int, threads: int
) -> subprocess.Popen:
    """`logstream serve` on `topics`, returned once /readyz answers 200."""
    port = free_port()
    config = {
        "model": {"dir": str(model), "threads": threads},
        "kafka": {
            "bootstrap_servers": broker.bootstrap,
            "topics": topics,
            "group_id": "bench",
            "max_poll_records": batch,
        },
        "input": {"stream_key": "message_key"},
        "sink": {"path": str(work / "kafka-anomalies.jsonl")},
        "http": {"host": "127.0.0.1", "port": port},
        "log_format": "json",
        "log_level": "warning",
    }
    (work / "serve.yaml").write_text(yaml.safe_dump(config))
    serve = subprocess.Popen(
        [sys.executable, "-m", "logstream.cli", "serve", "--config", str(work / "serve.yaml")],
        stderr=(work / "serve.log").open("wb"),
    )

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait(ready, "serve ready")
    return serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="lines per repetition")
    parser.add_argument("--reps", type=int, default=3, help="replay and Kafka runs, alternated")
    parser.add_argument("--batch", type=int, default=64, help="max_poll_records and replay batch")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: train tiny)")
    parser.add_argument("--lag-seconds", type=float, default=30.0)
    parser.add_argument("--lag-share", type=float, default=0.5, help="produce rate / replay rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, replay and serve alike")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="logstream-bench-"))
    model = args.model or train_model(work / "model")
    lines = generate_lines(args.lines, seed=21).lines
    log_file = work / "app.log"
    log_file.write_text("\n".join(lines) + "\n")
    messages = [(r.stream.encode(), r.line.encode()) for r in parse_lines(lines, STREAM_KEY)]

    broker = KafkaBroker(work / "kafka")
    broker.start()
    serve = None
    try:
        topic, lag_topic = "bench", "bench-lag"
        asyncio.run(create_topic(broker.bootstrap, topic, 1))
        asyncio.run(create_topic(broker.bootstrap, lag_topic, 1))
        serve = start_serve(work, broker, model, [topic, lag_topic], args.batch, args.threads)
        # alternate replay and Kafka runs over the same lines: the machine is shared, so
        # compare medians over repetitions, not one noisy pair
        replays, kafkas = [], []
        for rep in range(args.reps):
            replays.append(replay_rate(model, log_file, work / f"replay-{rep}.jsonl", args.batch))
            kafkas.append(asyncio.run(_kafka_run(broker.bootstrap, topic, messages)))
        replay, kafka = statistics.median(replays), statistics.median(kafkas)
        rate = replay * args.lag_share
        samples, drain = asyncio.run(_steady(broker.bootstrap, lag_topic, messages, rate, args.lag_seconds))
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=60)
        broker.stop()
    result = {
        "lines_per_rep": len(messages),
        "batch": args.batch,
        "threads": args.threads,
        "replay_lines_per_s": [round(r, 1) for r in replays],
        "kafka_lines_per_s": [round(k, 1) for k in kafkas],
        "overhead_ratio_of_medians": round(replay / kafka, 3),
        "lag_produce_rate_per_s": round(rate, 1),
        "lag_mean": round(statistics.mean(samples), 1),
        "lag_max": max(samples),
        "lag_drain_s_after_stop": round(drain, 2),
    }
    sys.stdout.write(json.dumps(result) + "\n")


async def _kafka_run(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> float:
    """Lines/s from the first send until serve committed the last line."""
    async with LagProbe(bootstrap, "bench") as probe:
        started = time.perf_counter()
        await produce(bootstrap, topic, messages, partition=0)
        await probe.drained(topic)
        return len(messages) / (time.perf_counter() - started)


async def _steady(
    bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float, seconds: float
) -> tuple[list[int], float]:
    """Produce at `rate` lines/s for `seconds`, sampling lag every 0.5 s; then time the drain."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    samples: list[int] = []
    async with LagProbe(bootstrap, "bench") as probe:
        try:
            started = time.perf_counter()
            sent, next_sample = 0, started
            while (now := time.perf_counter()) - started < seconds:
                while sent < int((now - started) * rate):
                    key, value = messages[sent % len(messages)]
                    await producer.send(topic, value, key=key, partition=0)
                    sent += 1
                if now >= next_sample:
                    await producer.flush()
                    samples.append(await probe.lag(topic))
                    next_sample += 0.5
                await asyncio.sleep(0.01)
            await producer.flush()
        finally:
            await producer.stop()
        drain_started = time.perf_counter()
        await probe.drained(topic)
    return samples, time.perf_counter() - drain_started


if __name__ == "__main__":
    main()
