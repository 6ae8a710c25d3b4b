"""End-to-end lines/s through Kafka vs a file replay of the same lines, and lag under load.

Starts a real Kafka broker (tests/kafka_broker.py; run .ci/kafka.sh first),
then, with one model:

1. replay: the lines from a file through `read_file` -> `Detector.score` ->
   JsonlSink, in batches of `--batch` (serve's max_poll_records), run before
   and after step 2 (the machine is shared: the two bracket its noise);
2. kafka: `logstream serve` (a subprocess, warmed up and ready) consumes the
   same lines produced at once; timed from the first send to the last commit;
3. lag: lines produced at a steady rate (a share of the replay rate) for
   `--lag-seconds`; the group's lag (end offset - committed) is sampled.

    .venv/bin/python benchmarks/kafka_throughput.py --lines 1500 [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402 - after the tests/ path insert, like the imports below
import yaml  # noqa: E402
from kafka_broker import (  # noqa: E402
    KafkaBroker,
    committed_offsets,
    create_topic,
    end_offsets,
    free_port,
    produce,
)

from logstream.alerts.sink import JsonlSink  # noqa: E402
from logstream.consumers.file import read_file  # noqa: E402
from logstream.consumers.parse import RecordParser, RejectLog  # noqa: E402
from logstream.detector import Detector  # noqa: E402
from logstream.settings import InputSettings  # noqa: E402
from logstream.synth import STREAM_KEY, generate_lines  # noqa: E402
from logstream.train import Stream, TrainConfig, save, train  # noqa: E402

TIMEOUT_S = 900.0


def train_model(out: Path) -> Path:
    by_stream: dict[str, list[str]] = {}
    for line in generate_lines(1500, seed=0).lines:
        by_stream.setdefault(re.search(STREAM_KEY, line).group(1), []).append(line)
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=80)
    save(train([Stream(k, v) for k, v in by_stream.items()], config), out)
    return out


def replay_rate(model: Path, log_file: Path, sink: Path, batch: int) -> float:
    """Lines/s of file -> parse -> score -> sink with one Detector (load not timed)."""
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


def lag(broker: KafkaBroker, topic: str, group: str) -> int:
    ends = asyncio.run(end_offsets(broker.bootstrap, topic, [0]))
    committed = asyncio.run(committed_offsets(broker.bootstrap, group))
    return ends[0] - committed.get((topic, 0), 0)


def wait(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64, help="max_poll_records and replay batch")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: train tiny)")
    parser.add_argument("--lag-seconds", type=float, default=30.0)
    parser.add_argument("--lag-share", type=float, default=0.5, help="produce rate / replay rate")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="logstream-bench-"))
    model = args.model or train_model(work / "model")
    lines = generate_lines(args.lines, seed=21).lines
    log_file = work / "app.log"
    log_file.write_text("\n".join(lines) + "\n")
    messages = [(re.search(STREAM_KEY, line).group(1).encode(), line.encode()) for line in lines]

    broker = KafkaBroker(work / "kafka")
    broker.start()
    serve = None
    try:
        # replay before and after the Kafka run: the machine is shared, so bracket the noise
        replay_before = replay_rate(model, log_file, work / "replay-1.jsonl", args.batch)
        topic, lag_topic = "bench", "bench-lag"
        asyncio.run(create_topic(broker.bootstrap, topic, 1))
        asyncio.run(create_topic(broker.bootstrap, lag_topic, 1))
        port = free_port()
        config = {
            "model": {"dir": str(model)},
            "kafka": {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic, lag_topic],
                "group_id": "bench",
                "max_poll_records": args.batch,
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
        started = time.perf_counter()
        asyncio.run(produce(broker.bootstrap, topic, messages, partition=0))
        wait(lambda: lag(broker, topic, "bench") == 0, "kafka drained")
        kafka = len(messages) / (time.perf_counter() - started)
        replay_after = replay_rate(model, log_file, work / "replay-2.jsonl", args.batch)
        replay = (replay_before + replay_after) / 2

        rate = replay * args.lag_share
        samples = asyncio.run(_steady(broker, lag_topic, messages, rate, args.lag_seconds))
        drain_started = time.perf_counter()
        wait(lambda: lag(broker, lag_topic, "bench") == 0, "lag drained")
        drain = time.perf_counter() - drain_started
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=60)
        broker.stop()
    result = {
        "lines": len(messages),
        "batch": args.batch,
        "replay_lines_per_s": [round(replay_before, 1), round(replay_after, 1)],
        "kafka_lines_per_s": round(kafka, 1),
        "overhead_ratio": round(replay / kafka, 3),
        "lag_produce_rate_per_s": round(rate, 1),
        "lag_mean": round(statistics.mean(samples), 1),
        "lag_max": max(samples),
        "lag_drain_s_after_stop": round(drain, 2),
    }
    sys.stdout.write(json.dumps(result) + "\n")


async def _steady(broker: KafkaBroker, topic: str, messages, rate: float, seconds: float) -> list[int]:
    """Produce at `rate` lines/s for `seconds`, sampling the group's lag every 0.5 s."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await producer.start()
    samples: list[int] = []
    try:
        started = time.perf_counter()
        sent, next_sample = 0, started
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate)
            while sent < due:
                key, value = messages[sent % len(messages)]
                await producer.send(topic, value, key=key, partition=0)
                sent += 1
            if now >= next_sample:
                await producer.flush()
                samples.append(await asyncio.to_thread(lag, broker, topic, "bench"))
                next_sample += 0.5
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.stop()
    return samples


if __name__ == "__main__":
    main()
