"""The test broker itself: the fixture every Kafka test stands on must not fail at random."""

from __future__ import annotations

from pathlib import Path

from kafka_broker import KafkaBroker


def test_a_cluster_id_starting_with_a_dash_formats(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    # `kafka_broker` only for its jars: the fixture resolves them (or skips, or fails under CI)
    # one random id in 64 starts with "-"; given as `-t ID`, Kafka's StorageTool read it as an
    # option and the whole Kafka suite errored at setup (CI of stop 19)
    broker = KafkaBroker(tmp_path, cluster_id="-0TZhVZMSual6OLw5U90RA")
    broker.write_config()
    meta = (tmp_path / "data" / "meta.properties").read_text()
    assert "cluster.id=-0TZhVZMSual6OLw5U90RA" in meta
