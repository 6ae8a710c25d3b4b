"""The test broker itself: the fixture every Kafka test stands on must not fail at random, and
runs only the jars whose hashes are pinned."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kafka_broker import LIBS, REPO, KafkaBroker


def test_a_cluster_id_starting_with_a_dash_formats(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    # `kafka_broker` only for its jars: the fixture resolves them (or skips, or fails under CI)
    # one random id in 64 starts with "-"; given as `-t ID`, Kafka's StorageTool reads it as an
    # option, and the whole Kafka suite would error at setup
    broker = KafkaBroker(tmp_path, cluster_id="-0TZhVZMSual6OLw5U90RA")
    broker.write_config()
    meta = (tmp_path / "data" / "meta.properties").read_text()
    assert "cluster.id=-0TZhVZMSual6OLw5U90RA" in meta


def _provision(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(repo / ".ci" / "kafka.sh")], capture_output=True, text=True, timeout=300, check=False
    )


def test_provisioning_checks_every_jar_against_its_pinned_hash(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """.ci/kafka.sh accepts the resolved jars only when each matches its sha256 in
    .ci/kafka-jars.sha256: the jars in place pass; a copy with one jar changed fails, naming it."""
    # `kafka_broker` only for its jars, as above
    assert "each matching .ci/kafka-jars.sha256" in _provision(REPO).stdout
    copy = tmp_path / "repo"
    shutil.copytree(REPO / ".ci", copy / ".ci")
    shutil.copytree(LIBS, copy / ".cache" / "kafka" / "libs")
    jar = next((copy / ".cache" / "kafka" / "libs").glob("kafka-clients-*.jar"))
    jar.write_bytes(jar.read_bytes() + b"\0")
    done = _provision(copy)
    assert done.returncode == 1 and f"{jar.name}: FAILED" in done.stdout + done.stderr
