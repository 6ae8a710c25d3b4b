"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_broker import REPO, KafkaBroker, jars_present


# --- Kafka (tests/kafka_broker.py) -------------------------------------------------------------
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
