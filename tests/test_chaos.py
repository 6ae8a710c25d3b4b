"""Chaos, short: `logstream serve` loses no line and no alert while everything around it fails.

The harness is benchmarks/chaos.py (a longer run: `.venv/bin/python benchmarks/chaos.py`);
this is its CI variant: about a minute of lines on a real broker, two `kill -9` of serve with
restarts, a broker restart, poison messages of every kind, and a webhook receiver that fails
the first attempt of every page and a third of the retries (500, 429 + Retry-After, hang,
reset). Waits are bounded; nothing is timed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from benchmarks_support import load_benchmark
from kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_chaos_run_loses_no_line_and_no_alert(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Every produced line is scored at least once and every stream with an anomaly is paged
    (2xx at the receiver), across kill -9 + restarts, a broker restart, poison and a failing
    receiver; poison is dead-lettered."""
    chaos = load_benchmark("chaos")
    config = chaos.ChaosConfig(
        seconds=45, rate=10, partitions=2, kills=2, broker_restarts=1, poison=7, anomalies=6, seed=11
    )
    report = chaos.run_chaos(
        config, kafka_broker, synthetic_model_dir, tmp_path, f"chaos-{uuid.uuid4().hex[:8]}"
    )
    print(report.summary())
    for line in report.unexpected_exits:  # e.g. started while the broker was restarting
        print(f"unexpected serve exit: {line}")
    assert (report.kills, report.broker_restarts) == (2, 1)
    assert report.sent_messages == report.planned_messages
    assert report.produced_poison == 7
    assert report.injected_detected >= 1, report.summary()  # the alert check is not vacuous
    failed = {answer for answer in report.receiver_answers if not answer.startswith("2")}
    assert failed == {"500", "429", "503", "drop"}, report.summary()  # each failure kind happened
    assert report.lost_lines == 0, report.summary()
    assert report.lost_anomaly_streams == [], report.summary()
    assert report.dead_letters >= report.produced_poison, report.summary()
    assert report.settled and report.final_exit_code == 0, report.summary()
