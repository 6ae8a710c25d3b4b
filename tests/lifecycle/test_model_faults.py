"""A model that fails to load never takes serve down: a damaged model directory is one clear
line (logstream.engine.model), a hot reload of one keeps the current model, serve starts on the
newest version that loads, and a failing shadow is dropped (logstream.lifecycle.follower, shadow).

Every case is a real model directory on disk: a copy of the session's synthetic model with
one fault in its files (tests/broken_models.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import structlog
import torch
from alerts_support import FakeClock
from broken_models import BREAKAGES, broken_copy
from prometheus_client import REGISTRY

from logstream.alerts.sink import JsonlSink
from logstream.consumers.kafka import Batch
from logstream.errors import UserError
from logstream.evaluation.synth import generate_lines
from logstream.lifecycle import model_store
from logstream.lifecycle.follower import ModelFollower, load_checked, load_version
from logstream.lifecycle.shadow import Shadow
from logstream.metrics import Health
from logstream.records import LogRecord
from logstream.serve import AuditLog, Service
from logstream.settings import ServeSettings

CPU = {"device": "cpu"}
# What each breakage's error says (besides naming the directory).
REASONS = {
    "hidden_size_doubled": "the weights do not fit config.json: model.embed_tokens.weight is",
    "zero_heads": "config.json: num_attention_heads: 0 is not a positive integer",
    "one_layer_more": "the weights do not fit config.json: model.layers.2.",
    "tokenizer_corrupt": "tokenizer.json is damaged",
    "weights_truncated": "could not be loaded: model.safetensors: ",
    "weights_nan": "a trial line scores NaN or infinite surprisal",
}


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _store(model_dir: Path, tmp_path: Path, *breakages: str) -> Path:
    """A store whose v0001 is `model_dir`, then one version per breakage, each added as a
    store library call adds it (no trial load), none promoted."""
    store = tmp_path / "store"
    model_store.add(store, model_dir)
    for i, breakage in enumerate(breakages):
        model_store.add(store, broken_copy(model_dir, tmp_path / f"broken-{i}", breakage))
    return store


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_damaged_model_directory_is_one_line_naming_the_fault(
    synthetic_model_dir: Path, tmp_path: Path, breakage: str
) -> None:
    """Loading it as serve and `models add|promote` do (load, then a trial line) raises a
    UserError: one line, with the directory and what is wrong in it."""
    broken = broken_copy(synthetic_model_dir, tmp_path / "broken", breakage)
    with pytest.raises(UserError) as raised:
        load_checked(broken, CPU)
    message = str(raised.value)
    assert "\n" not in message and str(broken) in message and REASONS[breakage] in message


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_hot_reload_of_a_damaged_version_keeps_the_current_model(
    synthetic_model_dir: Path, tmp_path: Path, breakage: str
) -> None:
    """A promoted version that does not load: the poll hands back no model, the current one
    goes on scoring, the failure is counted, the fallback gauge is 1, and the version is not
    tried again while it stays live."""
    store = _store(synthetic_model_dir, tmp_path, breakage)
    model_store.promote(store, "v0001")
    clock = FakeClock()
    follower = ModelFollower(store, CPU, reload_seconds=5, clock=clock)
    current = follower.load_live()
    failures = _sample("logstream_model_load_failures_total")
    model_store.promote(store, "v0002")
    clock.advance(5)
    with structlog.testing.capture_logs() as logs:
        assert follower.poll(current) is None
    assert [(e["event"], e["version"]) for e in logs] == [("model_reload_failed", "v0002")]
    assert REASONS[breakage] in logs[0]["reason"]
    assert _sample("logstream_model_load_failures_total") == failures + 1
    assert _sample("logstream_model_fallback") == 1
    clock.advance(5)
    assert follower.poll(current) is None
    assert _sample("logstream_model_load_failures_total") == failures + 1
    assert len(current.score([LogRecord(line=generate_lines(1, seed=5).lines[0], stream="a")])) == 1


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_serve_starts_on_the_newest_version_on_the_rollback_path_that_loads(
    synthetic_model_dir: Path, tmp_path: Path, breakage: str
) -> None:
    """Live is v0003 (damaged), promoted after v0002 (damaged) after v0001: the start skips
    both, each with a log event naming it and why, and serves v0001 with the fallback gauge
    at 1."""
    store = _store(synthetic_model_dir, tmp_path, breakage, breakage)
    for version in ("v0001", "v0002", "v0003"):
        model_store.promote(store, version)
    follower = ModelFollower(store, CPU)
    with structlog.testing.capture_logs() as logs:
        detector = follower.load_live()
    assert detector.model_id.startswith("v0001@") and (follower.serving, follower.version) == (
        "v0001",
        "v0003",
    )
    skipped = [e for e in logs if e["event"] == "model_version_skipped"]
    assert [e["version"] for e in skipped] == ["v0003", "v0002"]
    assert all(REASONS[breakage] in e["reason"] for e in skipped)
    assert _sample("logstream_model_fallback") == 1


def test_serve_does_not_start_when_no_version_on_the_rollback_path_loads(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """With every promoted version damaged the start is one StoreError listing each and why."""
    store = _store(synthetic_model_dir, tmp_path, "zero_heads")
    model_store.promote(store, "v0002")
    with pytest.raises(
        model_store.StoreError, match=r"no version on the rollback path loads \(v0002: .*heads"
    ):
        ModelFollower(store, CPU).load_live()


def test_a_rollback_to_the_version_kept_needs_no_reload(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """After a failed reload, a rollback makes the version serve kept live again: no load,
    and the fallback gauge goes back to 0."""
    store = _store(synthetic_model_dir, tmp_path, "zero_heads")
    model_store.promote(store, "v0001")
    clock = FakeClock()
    follower = ModelFollower(store, CPU, reload_seconds=5, clock=clock)
    current = follower.load_live()
    model_store.promote(store, "v0002")
    clock.advance(5)
    assert follower.poll(current) is None and _sample("logstream_model_fallback") == 1
    model_store.rollback(store)
    clock.advance(5)
    with structlog.testing.capture_logs() as logs:
        assert follower.poll(current) is None
    assert logs == [] and _sample("logstream_model_fallback") == 0


def test_a_version_whose_files_changed_is_refused_by_its_content_hash(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """A version whose config.json was edited after it was added still loads as a model, but
    the store's content hash refuses it by name."""
    store = _store(synthetic_model_dir, tmp_path)
    config = model_store.version_dir(store, "v0001") / "config.json"
    config.chmod(0o644)
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    with pytest.raises(model_store.StoreError, match="v0001's files changed since it was added"):
        load_version(store, "v0001", CPU)


def test_a_shadow_that_does_not_load_is_counted_and_left_out(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """`Shadow.open` on a damaged version: None (serve runs without a shadow), one failure
    counted at the load stage, one log event naming the version."""
    store = _store(synthetic_model_dir, tmp_path, "hidden_size_doubled")
    failures = _sample("logstream_shadow_failures_total", stage="load")
    with structlog.testing.capture_logs() as logs:
        assert Shadow.open(store, "v0002", CPU) is None
    assert [(e["event"], e["version"]) for e in logs] == [("shadow_dropped", "v0002")]
    assert _sample("logstream_shadow_failures_total", stage="load") == failures + 1


def test_a_shadow_that_fails_to_score_is_dropped_and_the_live_model_goes_on(
    synthetic_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve's scoring step with a shadow whose device fails mid-batch (the fault injected
    into its engine: out of memory): the live model's lines are handed off and audited, the
    shadow is dropped and counted, and the next batch is scored by the live model alone."""
    store = _store(synthetic_model_dir, tmp_path)
    shadow = Shadow.open(store, "v0001", CPU)
    assert shadow is not None

    def out_of_memory(*_: object, **__: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(shadow.detector.engine, "score", out_of_memory)
    lines = generate_lines(20, seed=8).lines
    failures = _sample("logstream_shadow_failures_total", stage="score")
    audit = tmp_path / "audit.jsonl"

    async def two_batches() -> Service:
        # Kafka's consumer is made, never started: the step under test is the worker thread's
        settings = ServeSettings(
            model={"dir": synthetic_model_dir, "threads": 1},
            kafka={"bootstrap_servers": "127.0.0.1:9", "topics": ["logs"], "group_id": "g"},
            sink={"kind": "jsonl", "path": tmp_path / "anomalies.jsonl"},
        )
        service = Service(
            settings, load_checked(synthetic_model_dir, CPU), JsonlSink(tmp_path / "anomalies.jsonl"),
            Health(model_loaded=True), AuditLog(audit), shadow=shadow,
        )  # fmt: skip
        for start in (0, 10):
            records = [
                LogRecord(line=line, stream="web-1", source="logs/0", offset=start + i)
                for i, line in enumerate(lines[start : start + 10])
            ]
            service._score_and_hand_off(Batch(records=records, messages=len(records)))
        await service.source.consumer.stop()
        return service

    service = asyncio.run(two_batches())
    audited = audit.read_text().splitlines()
    assert service.shadow is None and len(audited) == 20 and '"shadow"' not in audit.read_text()
    assert _sample("logstream_shadow_failures_total", stage="score") == failures + 1
