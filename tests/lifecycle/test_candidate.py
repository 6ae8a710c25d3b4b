"""Scheduled candidates: serve continues the live version on its recent unflagged traffic
and adds the result to the model store as a new version, which it never promotes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kafka_broker import KafkaBroker, produce
from serve_support import ODD_LINE, Serve, fully_committed, new_topic, normal_lines, wait_for

from logstream.consumers.inputs import parse_lines
from logstream.detector import Detector
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.lifecycle import model_store
from logstream.lifecycle.candidate import CandidateTrainer
from logstream.lifecycle.retrain import SAMPLE_FILE
from logstream.lifecycle.train import TrainConfig
from logstream.records import LogRecord


class Clock:
    """A hand-moved clock: the schedule is tested without waiting on real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_candidate_is_due_by_time_and_lines_and_learns_only_unflagged_lines(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    model_store.add(store, synthetic_model_dir)
    model_store.promote(store, "v0001")
    clock = Clock()
    trainer = CandidateTrainer(store, 3600.0, 200, 1000, TrainConfig(max_steps=10), clock=clock)
    detector = Detector.load(synthetic_model_dir, device="cpu")
    odd = LogRecord(line=ODD_LINE, stream="web-1")
    scored = detector.score([*parse_lines(generate_lines(300, seed=5).lines, STREAM_KEY), odd])
    assert scored[-1].is_anomaly  # the odd line alerts: it must not teach the candidate
    trainer.observe(scored)
    clock.now = 600.0
    assert not trainer.maybe_start()  # 300 lines kept, but not due for an hour
    clock.now = 3600.0
    waiting = CandidateTrainer(store, 3600.0, 400, 1000, TrainConfig(max_steps=10), clock=clock)
    waiting.observe(scored)
    assert not waiting.maybe_start()  # due, but fewer lines than it needs
    assert trainer.maybe_start()
    assert not trainer.maybe_start()  # one at a time; the kept lines went to the candidate
    trainer.join(timeout=600)
    assert model_store.versions(store) == ["v0001", "v0002"]
    assert model_store.live(store) == "v0001"  # never promoted
    lineage = model_store.lineage(store, "v0002")
    assert lineage["parent"].startswith("v0001@") and "scheduled candidate" in lineage["comment"]
    sample = (model_store.version_dir(store, "v0002") / SAMPLE_FILE).read_text()
    lines = [line for text in sample.splitlines() for line in json.loads(text)["lines"]]
    assert ODD_LINE not in lines and scored[0].record.line in lines


@pytest.mark.kafka
def test_serve_adds_a_scheduled_candidate_to_its_store(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A running serve with a store and a schedule: after enough unflagged lines a new version
    appears in the store, lineage from the live one, still not live; serving went on."""
    store = tmp_path / "store"
    model_store.add(store, synthetic_model_dir)
    model_store.promote(store, "v0001")
    topic, group = new_topic(kafka_broker, partitions=1)
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        model={"dir": None, "store": str(store), "candidate_every_seconds": 0.001,
               "candidate_min_lines": 150, "candidate_steps": 10},
    ).start()  # fmt: skip
    try:
        wait_for(serve.ready, "serve ready")
        asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(200, seed=50)))
        wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "the lines committed")
        wait_for(lambda: len(model_store.versions(store)) == 2, "a candidate version", timeout=600)
        assert model_store.live(store) == "v0001"
        assert model_store.lineage(store, "v0002")["new_lines"] >= 150
        wait_for(lambda: serve.metric("logstream_candidates_total", outcome="added") == 1, "the metric")
    finally:
        assert serve.terminate() == 0
