"""Chaos, short: `logstream serve` loses no line and no alert, and stalls no partition, while
everything around it fails.

The harness is benchmarks/chaos.py (a longer run: `.venv/bin/python benchmarks/chaos.py`);
this is its CI variant: about a minute of lines on a real broker, two `kill -9` of serve with
restarts (the first one's restart finds two forged changelog records), a broker restart,
poison messages of every kind, a webhook receiver that fails the first attempt of every page
and a third of the retries (500, 429 + Retry-After, hang, reset), a broken model version
promoted in the store serve follows, and its feedback database locked by another process
for 8 s. Waits are bounded; nothing is timed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from benchmarks_support import load_benchmark
from kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_chaos_run_loses_no_line_and_no_alert_and_stalls_no_partition(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Every produced line is scored at least once and committed, every partition's committed
    offset reaches its end, /healthz never fails once up, and every stream with an anomaly is
    paged (2xx at the receiver), across kill -9 + restarts, a broker restart, poison, a failing
    receiver, forged changelog records, a broken model promoted and a locked feedback database;
    each of the three last faults shows in serve's own counters and log (the check is not
    vacuous); poison is dead-lettered."""
    chaos = load_benchmark("chaos")
    config = chaos.ChaosConfig(
        seconds=45, rate=10, partitions=2, kills=2, broker_restarts=1, poison=7, anomalies=6, seed=11,
        poisoned_restarts=1, broken_promotes=1, feedback_lock_s=8,
    )  # fmt: skip
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
    # the forged records were refused, each for its own reason
    assert report.forged_records == 2, report.summary()
    assert report.restore_failures["token_ids"] >= 1, report.summary()
    assert report.restore_failures["offset"] >= 1, report.summary()
    # the broken version failed its reload, and serve stayed on the version it had
    assert report.broken_promotes == report.fault_events["model_reload_failed"] == 1, report.summary()
    assert report.model_load_failures >= 1 and report.model_fallback == 1, report.summary()
    # the locked database failed refreshes, and a refresh after the release recovered
    assert report.feedback_lock_seconds >= 8, report.summary()
    assert report.feedback_refresh_errors.get("busy", 0) >= 1, report.summary()
    assert report.fault_events["feedback_refresh_recovered"] >= 1, report.summary()
    assert report.lost_lines == 0, report.summary()
    assert report.committed_lines == report.produced_lines, report.summary()
    assert report.partitions_stalled == [] and report.healthz_failures == [], report.summary()
    assert report.lost_anomaly_streams == [], report.summary()
    assert report.dead_letters >= report.produced_poison, report.summary()
    assert report.settled and report.final_exit_code == 0, report.summary()
