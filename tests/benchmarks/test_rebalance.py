"""benchmarks/rebalance.py's `restore` part on the real broker: what the restore time is
measured on. The times themselves are never asserted (docs/benchmarks.md holds them)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from benchmarks_support import load_benchmark
from kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka


def test_restore_reads_back_every_state_it_wrote(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path
) -> None:
    """The states written to the changelog topic all come back through `Changelog.read` with
    the model's id and vocabulary (none refused by the record checks), and serve's restore runs
    on them."""
    rebalance = load_benchmark("rebalance")
    topic = f"restore-{uuid.uuid4().hex[:8]}"
    result = asyncio.run(rebalance.restore_bench(kafka_broker, synthetic_model_dir, 12, 128, topic))
    assert (result["streams"], result["read_states"]) == (12, 12)
