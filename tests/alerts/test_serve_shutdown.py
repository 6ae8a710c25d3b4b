"""SIGTERM to a real `logstream serve` (real broker, alert sink, real receiver): an anomaly
whose offset is committed while its group still waits in `group_wait` is delivered on the
way out, not lost with the pod."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from alerts_support import webhook, write_routes
from http_receivers import Receiver
from kafka_broker import KafkaBroker, produce
from serve_support import ODD_LINE, Serve, fully_committed, new_topic, normal_lines, wait_for

pytestmark = pytest.mark.kafka


def test_sigterm_to_serve_delivers_the_group_still_in_group_wait(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """group_wait 1h: every offset is committed and nothing sent yet; after SIGTERM serve
    exits 0 and the receiver has the odd line's alert."""
    topic, group = new_topic(kafka_broker, partitions=1)
    messages = [*normal_lines(40, seed=19), (b"web-1", ODD_LINE.encode())]
    asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], route={"group_wait": "1h"})
        sink = {"kind": "alerts", "routes": str(routes)}
        serve = Serve(tmp_path, kafka_broker, synthetic_model_dir, topic, group, sink=sink).start()
        wait_for(serve.ready, "serve ready")
        wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "everything committed")
        sent_before = list(receiver.requests)
        assert serve.terminate() == 0, serve.stderr_path.read_text()[-2000:]
        bodies = [json.dumps(r.body) for r in receiver.ok()]
    assert sent_before == []  # committed, but still inside group_wait
    assert any("qwzx" in body for body in bodies)
