"""Replay is a backtest of serve: the same file through `logstream replay --alerts` and
through `logstream serve` (a real Kafka broker, a real webhook receiver on 127.0.0.1) gives
the same anomalies and the same alert groups.

Both read the lines through the same `RecordParser` (plain lines, the stream from the same
regex), score them with one `Detector` and build their anomalies with `Detector.anomaly`.
What may differ, by design: serve scores whatever Kafka hands it in batches (so a line's
float score may differ in the last digits), its clock is the wall clock (replay's is the log's
own), and its alerts carry topic/partition@offset where replay's carry path:line. Online
refits of the tail happen line by line, so batching does not move them either
(tests/scoring/test_calibration.py checks that across refits).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alerts_support import webhook, write_routes
from http_receivers import Receiver
from kafka_broker import KafkaBroker, produce
from serve_support import Serve, fully_committed, new_topic, read_jsonl, wait_for

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines

pytestmark = pytest.mark.kafka
LINES = 360
SCORE_TOLERANCE = 1e-3  # serve batches differently: the same score up to float noise


def groups(received: list[Any]) -> list[tuple[str, str]]:
    """(group labels, the group's first line) of each group that fired, sorted. Not its key: a
    group's first incident is numbered by the second it opened, in the log's time in a replay
    and the wall clock's in serve (`alerts.grouping`)."""
    out: dict[str, tuple[str, str]] = {}
    for request in received:
        body = request.body
        if body["status"] == "firing" and body["groupKey"] not in out:
            labels = json.dumps(body["groupLabels"], sort_keys=True)
            out[body["groupKey"]] = (labels, body["commonAnnotations"]["first_line"])
    return sorted(out.values())


def test_replay_and_serve_give_the_same_anomalies_and_alert_groups(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """One synthetic log with every incident kind: replay --alerts --deliver and serve (sink:
    alerts) flag the same lines with the same scores, and notify the same groups, each
    starting with the same line."""
    log = generate_lines(LINES, seed=23, incidents=INCIDENT_KINDS * 2, incident_start=0.3)
    path = tmp_path / "app.log"
    path.write_text("\n".join(log.lines) + "\n", encoding="utf-8")
    (tmp_path / "replay").mkdir()
    (tmp_path / "serve").mkdir()

    with Receiver() as replay_receiver, Receiver() as serve_receiver:
        replay_routes = write_routes(tmp_path / "replay", [webhook("oncall", replay_receiver.url)])
        serve_routes = write_routes(tmp_path / "serve", [webhook("oncall", serve_receiver.url)])
        scores = tmp_path / "replay" / "scores.jsonl"
        replay = subprocess.run(
            [sys.executable, "-m", "logstream", "replay", str(path), "--model", str(synthetic_model_dir),
             "--stream-key", STREAM_KEY, "--alerts", str(replay_routes), "--deliver",
             "--out", str(scores), "--json"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr
        replayed = {
            (row["line"] - 1, row["stream"]): row["score"] for row in read_jsonl(scores) if row["anomaly"]
        }
        replay_groups = groups(replay_receiver.ok())
        assert replayed and replay_groups  # the incidents are found: the comparison below has teeth

        topic, group = new_topic(kafka_broker, partitions=1)  # one partition: the file's order
        asyncio.run(produce(kafka_broker.bootstrap, topic, [(None, line.encode()) for line in log.lines]))
        serve = Serve(
            tmp_path / "serve", kafka_broker, synthetic_model_dir, topic, group,
            sink={"kind": "alerts", "routes": str(serve_routes)},
            input={"format": "plain", "stream_key": "regex", "stream_regex": STREAM_KEY},
        ).start()  # fmt: skip
        wait_for(serve.ready, "serve ready")
        wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "every line committed")
        wait_for(lambda: len(groups(serve_receiver.ok())) >= len(replay_groups), "serve's notifications")
        assert serve.terminate() == 0
        serve_groups = groups(serve_receiver.ok())

    served = {
        (entry["offset"], entry["stream"]): entry["score"]
        for entry in read_jsonl(serve.audit)
        if entry["kind"] == "line" and entry["anomaly"]
    }
    assert served.keys() == replayed.keys()  # the same lines (offset = line - 1: one partition)
    assert served == pytest.approx(replayed, abs=SCORE_TOLERANCE)
    assert serve_groups == replay_groups
