"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

# One intra-op thread per process: tests run several processes at once (a broker, serve
# subprocesses, pytest) on two cores, and OpenMP threads spinning against each other made a
# 4-second scoring run take 100 seconds. Set before torch is imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from cli_support import logstream, write_lines
from kafka_broker import REPO, KafkaBroker, jars_present
from synthetic_model import train_synthetic_model

from logstream.evaluation.synth import STREAM_KEY, generate_lines


# --- Kafka (benchmarks/support/kafka_broker.py) ---------------------------------------------
@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Apache Kafka broker (KRaft, one node, loopback), started once per test session.

    Resolves the jars with `.ci/kafka.sh` when they are missing and Java + Maven are at
    hand. Without them the Kafka tests skip, except under CI=true, where they fail.
    """
    if not jars_present() and shutil.which("java") and shutil.which("mvn"):
        subprocess.run(["bash", str(REPO / ".ci" / "kafka.sh")], check=True, timeout=600)
    if not (jars_present() and shutil.which("java")):
        reason = "Kafka broker jars or Java missing: run .ci/kafka.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


# --- Models (logstream.lifecycle.train) -------------------------------------------------------
@pytest.fixture(scope="session")
def synthetic_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model (window 128, 1000 steps) trained on 4,000 clean synthetic lines: good enough
    to catch every synthetic incident kind (tests/evaluation/test_detection.py), about a minute on 2 cores."""
    return train_synthetic_model(tmp_path_factory.mktemp("synthetic-model") / "model")


@pytest.fixture(scope="session")
def cli_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained through `logstream train` (20 steps: for the CLI's contract, not its
    quality); its stderr kept beside it as train.stderr."""
    tmp = tmp_path_factory.mktemp("cli")
    baseline = write_lines(tmp / "baseline.log", generate_lines(800, seed=11).lines)
    out = tmp / "model"
    result = logstream(
        "train", baseline, "--out", out, "--preset", "tiny", "--window", "64",
        "--max-steps", "20", "--stream-key", STREAM_KEY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (tmp / "train.stderr").write_text(result.stderr)  # tests/test_cli.py reads it
    return out
