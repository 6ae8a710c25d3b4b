"""A running `logstream serve` that follows a model store (real broker, real webhook receiver):
promote and rollback switch the scoring version between batches with every offset scored
once and committed, a shadow candidate scores the same records without ever paging, and
versions that do not load never stop it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from alerts_support import webhook, write_routes
from broken_models import broken_copy
from http_receivers import Receiver
from kafka_broker import KafkaBroker, free_port, produce
from serve_support import ODD_LINE, Serve, fully_committed, new_topic, normal_lines, read_jsonl, wait_for

from logstream.lifecycle import model_store

pytestmark = pytest.mark.kafka


def _models(*args: str | Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "models", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_promote_rollback_and_shadow_in_a_running_serve(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Four batches of traffic (each with one odd line): under v0001, after `models promote
    v0002`, after `models rollback`, after a POST /feedback marking the odd line normal (then it
    is scored but not an anomaly). Each batch is scored by the version live when it arrived,
    every offset is audited exactly once by the live model and committed; the shadow (v0003)
    scored every record too and flagged the odd lines, its counts are on /metrics, and not
    one webhook call carries its model id."""
    store = tmp_path / "store"
    for _ in range(3):
        model_store.add(store, synthetic_model_dir)
    model_store.promote(store, "v0001")
    topic, group = new_topic(kafka_broker, partitions=1)
    tokens = tmp_path / "feedback-tokens"
    tokens.write_text("on-call:on-call-0123456789abcdef\n")
    feedback_port = free_port()
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        serve = Serve(
            tmp_path, kafka_broker, synthetic_model_dir, topic, group,
            model={"dir": None, "store": str(store), "reload_seconds": 0.001, "shadow": "v0003"},
            sink={"kind": "alerts", "routes": str(routes)},
            feedback={"tokens_file": str(tokens), "host": "127.0.0.1", "port": feedback_port},
        ).start()  # fmt: skip
        wait_for(serve.ready, "serve ready")
        placed: list[tuple[int, int]] = []
        batches = (
            ("v0001", None),
            ("v0002", ("promote", "--store", store, "v0002")),
            ("v0001", ("rollback", "--store", store)),
            ("v0001", "feedback"),
        )
        for i, (_, command) in enumerate(batches):
            if command == "feedback":  # the odd line's template marked normal over HTTP
                answer = httpx.post(
                    f"http://127.0.0.1:{feedback_port}/feedback",
                    json={"verdict": "normal", "line": ODD_LINE},
                    headers={"Authorization": "Bearer on-call-0123456789abcdef"},
                )
                assert answer.status_code == 201, answer.text
                assert answer.json()["stored"][0]["created_by"] == "on-call"
            elif command is not None:
                _models(*command)
            messages = normal_lines(30, seed=40 + i)
            messages.insert(20, (b"web-1", ODD_LINE.encode()))
            placed += asyncio.run(produce(kafka_broker.bootstrap, topic, messages))
            wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), f"batch {i} committed")
        wait_for(lambda: len(receiver.ok()) >= 1, "a webhook call")
        reloads = serve.metric("logstream_model_reloads_total")
        shadow_flagged = serve.metric("logstream_model_flagged_lines_total", role="shadow")
        live_flagged = serve.metric("logstream_model_flagged_lines_total", role="live")
        overlap = serve.metric("logstream_shadow_overlap_lines_total")
        suppressed = serve.metric("logstream_feedback_suppressed_lines_total")
        assert serve.terminate() == 0
    audit = read_jsonl(serve.audit)
    live = [e for e in audit if e["kind"] == "line" and not e.get("shadow")]
    shadow = [e for e in audit if e["kind"] == "line" and e.get("shadow")]
    offsets = [offset for _, offset in placed]
    assert sorted(e["offset"] for e in live) == offsets  # each scored once: none lost, none twice
    assert sorted(e["offset"] for e in shadow) == offsets
    versions = [e["model"].split("@")[0] for e in sorted(live, key=lambda e: e["offset"])]
    assert versions == [v for v, _ in batches for _ in range(31)]
    assert {e["model"].split("@")[0] for e in shadow} == {"v0003"}
    assert reloads == 2 and shadow_flagged >= 3 and live_flagged >= 3 and overlap >= 3
    odd_offsets = {offset for _, offset in placed[20::31]}
    odd = [e for e in sorted(live, key=lambda e: e["offset"]) if e["offset"] in odd_offsets]
    assert [e["anomaly"] for e in odd] == [True, True, True, False]  # batch 4: the verdict holds
    assert odd[-1]["verdict"] == "normal" and suppressed >= 1
    calls = json.dumps([r.body for r in receiver.ok()])
    assert "v0001@" in calls and "v0003@" not in calls


def test_serve_outlives_damaged_versions_at_start_as_shadow_and_promoted_mid_run(
    kafka_broker: KafkaBroker, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A store whose live version (v0002) does not load, with a damaged shadow (v0003): serve
    starts on v0001 and without the shadow; a damaged v0004 promoted mid-run is refused. Both
    batches of traffic are scored by v0001, every offset once, and committed; /metrics counts
    the two versions and the shadow that failed and shows the fallback; the log names each."""
    store = tmp_path / "store"
    model_store.add(store, synthetic_model_dir)
    for i, breakage in enumerate(("weights_truncated", "zero_heads", "hidden_size_doubled")):
        model_store.add(store, broken_copy(synthetic_model_dir, tmp_path / f"broken-{i}", breakage))
    model_store.promote(store, "v0001")
    model_store.promote(store, "v0002")
    topic, group = new_topic(kafka_broker, partitions=1)
    serve = Serve(
        tmp_path, kafka_broker, synthetic_model_dir, topic, group,
        model={"dir": None, "store": str(store), "reload_seconds": 0.001, "shadow": "v0003"},
    ).start()  # fmt: skip
    wait_for(serve.ready, "serve ready")
    placed = asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(30, seed=50)))
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "batch 1 committed")
    model_store.promote(store, "v0004")  # as a store library call does it: no trial load
    placed += asyncio.run(produce(kafka_broker.bootstrap, topic, normal_lines(30, seed=51)))
    wait_for(lambda: fully_committed(kafka_broker, group, topic, 1), "batch 2 committed")
    failures = serve.metric("logstream_model_load_failures_total")
    fallback = serve.metric("logstream_model_fallback")
    shadow_failures = serve.metric("logstream_shadow_failures_total", stage="load")
    assert serve.terminate() == 0
    audit = read_jsonl(serve.audit)
    assert sorted(e["offset"] for e in audit) == [offset for _, offset in placed]
    assert {e["model"].split("@")[0] for e in audit} == {"v0001"} and not any(e.get("shadow") for e in audit)
    assert (failures, fallback, shadow_failures) == (2, 1, 1)
    events = [json.loads(line) for line in serve.stderr_path.read_text().splitlines() if line.startswith("{")]
    named = [(e["event"], e.get("version")) for e in events if "reason" in e]
    assert named == [
        ("model_version_skipped", "v0002"), ("shadow_dropped", "v0003"), ("model_reload_failed", "v0004")
    ]  # fmt: skip
