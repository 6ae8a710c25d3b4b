"""The model store (logstream.lifecycle.model_store): immutable numbered versions with lineage, promote
and rollback through an append-only history, and the `logstream models` commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from broken_models import broken_copy

from logstream.lifecycle import model_store
from logstream.lifecycle.model_store import StoreError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model directory, trained for 3 steps: the store copies and describes it, never scores."""
    from logstream.evaluation.synth import generate_lines
    from logstream.lifecycle.train import Stream, TrainConfig, save, train

    out = tmp_path_factory.mktemp("store-model") / "model"
    config = TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4)
    save(train([Stream("s", generate_lines(200, seed=1).lines)], config), out)
    return out


def _models(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", "models", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_added_versions_are_numbered_read_only_and_carry_lineage(model_dir: Path, tmp_path: Path) -> None:
    """`add` copies a model in as v0001, v0002 ...; its files are read-only and lineage.json
    repeats the training data's hash, counts and config, and the calibration."""
    store = tmp_path / "store"
    assert model_store.add(store, model_dir, by="ann", comment="first") == "v0001"
    assert model_store.add(store, model_dir) == "v0002"
    assert model_store.versions(store) == ["v0001", "v0002"]
    path = model_store.version_dir(store, "v0001")
    assert all(p.stat().st_mode & 0o222 == 0 for p in path.iterdir())
    meta = json.loads((model_dir / "logstream.json").read_text())
    info = model_store.lineage(store, "v0001")
    assert info["data_sha256"] == meta["data_sha256"] and info["train_lines"] == meta["train_lines"]
    assert info["train_config"] == meta["train_config"] and info["parent"] is None
    assert info["calibration"]["false_alarm_rate"] and (info["added_by"], info["comment"]) == ("ann", "first")


def test_promote_and_rollback_walk_the_history(model_dir: Path, tmp_path: Path) -> None:
    """Promote makes a version live; rollback returns to the one live before it, and again
    to the one before that; past the first promotion there is nothing to roll back to."""
    store = tmp_path / "store"
    for _ in range(3):
        model_store.add(store, model_dir)
    assert model_store.live(store) is None
    with pytest.raises(StoreError, match="nothing promoted"):
        model_store.live_dir(store)
    for version in ("v0001", "v0002", "v0003"):
        model_store.promote(store, version, by="ops")
    assert model_store.live(store) == "v0003"
    assert model_store.rollback(store).version == "v0002"
    assert model_store.rollback(store).version == "v0001"
    with pytest.raises(StoreError, match="no earlier live version"):
        model_store.rollback(store)
    with pytest.raises(StoreError, match="already live"):
        model_store.promote(store, "v0001")
    assert [e.action for e in model_store.history(store)] == ["promote"] * 3 + ["rollback"] * 2


def test_a_torn_last_line_does_not_swallow_the_next_promote(model_dir: Path, tmp_path: Path) -> None:
    """live.jsonl ends in half a line (a crash mid-write): the next promote is still recorded,
    on a line of its own, and is live; the torn line is skipped."""
    store = tmp_path / "store"
    for _ in range(2):
        model_store.add(store, model_dir)
    model_store.promote(store, "v0001")
    with (store / model_store.LIVE).open("a") as f:
        f.write('{"version": "v0002", "prev')
    model_store.promote(store, "v0002")
    assert model_store.live(store) == "v0002"
    assert [e.version for e in model_store.history(store)] == ["v0001", "v0002"]


def test_rollbacks_after_promoting_a_b_a_walk_back_not_to_and_fro(model_dir: Path, tmp_path: Path) -> None:
    """Promote v0001, v0002, v0001: rollback goes to v0002, then v0001, then there is nothing
    earlier (the history is a stack, not the last entry's `previous`)."""
    store = tmp_path / "store"
    for _ in range(2):
        model_store.add(store, model_dir)
    for version in ("v0001", "v0002", "v0001"):
        model_store.promote(store, version)
    assert model_store.rollback(store).version == "v0002"
    assert model_store.rollback(store).version == "v0001"
    with pytest.raises(StoreError, match="no earlier live version"):
        model_store.rollback(store)


@pytest.mark.parametrize("version", [5, None, ["v0001"]])
def test_a_version_that_is_not_a_string_is_one_line(model_dir: Path, tmp_path: Path, version: object) -> None:
    """promote, show (lineage) and the version's directory refuse a version that is not a
    string with a StoreError naming its type, never a TypeError."""
    store = tmp_path / "store"
    model_store.add(store, model_dir)
    for call in (model_store.promote, model_store.lineage, model_store.version_dir):
        with pytest.raises(
            StoreError, match=f"a version is a name like 'v0001', not {type(version).__name__}"
        ):
            call(store, version)  # type: ignore[operator]


def test_a_history_line_whose_version_is_not_a_name_is_skipped(model_dir: Path, tmp_path: Path) -> None:
    """A line of live.jsonl that parses but holds no version name (a number, a path) is
    skipped like a torn one: the live version is the last real promote."""
    store = tmp_path / "store"
    model_store.add(store, model_dir)
    model_store.promote(store, "v0001")
    with (store / model_store.LIVE).open("a") as f:
        for version in (5, "../../etc"):
            f.write(json.dumps({"version": version, "previous": None, "action": "promote", "at": 1.0}) + "\n")
    assert model_store.live(store) == "v0001"


def test_a_version_records_its_content_hash_and_promote_checks_it(model_dir: Path, tmp_path: Path) -> None:
    """lineage.json holds the hash of the version's weights, tokenizer, config.json and
    logstream.json; once a file of the version changed, promote refuses it by name."""
    from logstream.engine.metadata import content_sha256

    store = tmp_path / "store"
    model_store.add(store, model_dir)
    assert model_store.lineage(store, "v0001")["content_sha256"] == content_sha256(model_dir)
    tokenizer = model_store.version_dir(store, "v0001") / "tokenizer.json"
    tokenizer.chmod(0o644)
    tokenizer.write_text(tokenizer.read_text() + " ")
    with pytest.raises(StoreError, match="v0001's files changed since it was added"):
        model_store.promote(store, "v0001")
    assert model_store.live(store) is None


@pytest.mark.parametrize("changed", ["tokenizer.json", "model.safetensors"])
def test_the_model_id_covers_the_weights_and_the_tokenizer(
    synthetic_model_dir: Path, tmp_path: Path, changed: str
) -> None:
    """Two model directories of the same name trained on the same data, one with two tokens
    of its vocabulary swapped (or its weights scaled), load with different model ids."""
    from safetensors.torch import load_file, save_file

    from logstream.detector import Detector

    same, other = tmp_path / "a" / "model", tmp_path / "b" / "model"
    shutil.copytree(synthetic_model_dir, same)
    shutil.copytree(synthetic_model_dir, other)
    if changed == "tokenizer.json":
        tokenizer = json.loads((other / changed).read_text())
        vocab = tokenizer["model"]["vocab"]
        vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
        (other / changed).write_text(json.dumps(tokenizer))
    else:
        tensors = load_file(other / changed)
        tensors["model.norm.weight"] *= 2
        save_file(tensors, other / changed, metadata={"format": "pt"})
    ids = [Detector.load(d, device="cpu").model_id for d in (same, other)]
    assert ids[0].startswith("model@") and ids[1].startswith("model@") and ids[0] != ids[1]


def test_models_add_refuses_a_model_that_does_not_load(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """`models add` loads the model and scores a trial line first: a config.json whose
    hidden_size does not fit the weights is one line, exit 2, and nothing is added."""
    broken = broken_copy(synthetic_model_dir, tmp_path / "broken", "hidden_size_doubled")
    refused = _models("add", broken, "--store", tmp_path / "store")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: not added: {broken}: the weights do not fit config.json")
    assert model_store.versions(tmp_path / "store") == []


def test_models_promote_refuses_a_version_that_does_not_load(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """`models promote` of a version that was put in the store without the trial (a library
    `add`) and does not load (zero heads): one line, exit 2, and the live version stays."""
    store = tmp_path / "store"
    model_store.add(store, synthetic_model_dir)
    model_store.add(store, broken_copy(synthetic_model_dir, tmp_path / "broken", "zero_heads"))
    model_store.promote(store, "v0001")
    refused = _models("promote", "--store", store, "v0002")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert (
        refused.stderr.startswith("error: v0002 not promoted: ")
        and "num_attention_heads: 0" in refused.stderr
    )
    assert model_store.live(store) == "v0001"


def test_models_commands(model_dir: Path, tmp_path: Path) -> None:
    """add (with an evaluation on a fixed replay set), promote, list (live marked), show
    (lineage, evaluation and promotions), rollback; an unknown version is one line and exit 2."""
    from logstream.evaluation.synth import INCIDENT_KINDS, generate_lines

    store = tmp_path / "store"
    log = generate_lines(200, seed=9, incidents=INCIDENT_KINDS)
    (tmp_path / "eval.log").write_text("\n".join(log.lines) + "\n")
    (tmp_path / "eval.labels").write_text("\n".join(map(str, log.labels)) + "\n")
    assert _models("add", model_dir, "--store", store).stdout == "v0001\n"
    evaluated = _models(
        "add",
        model_dir,
        "--store",
        store,
        "--evaluate",
        tmp_path / "eval.log",
        "--labels",
        tmp_path / "eval.labels",
    )
    assert evaluated.stdout == "v0002\n", evaluated.stderr
    assert _models("promote", "--store", store, "v0001").returncode == 0
    promoted = _models("promote", "--store", store, "v0002", "-c", "shadow clean")
    assert promoted.stdout == "live: v0002 (was v0001)\n"
    listed = _models("list", "--store", store).stdout.splitlines()
    assert listed[0].startswith("  v0001") and listed[1].startswith("* v0002")
    shown = json.loads(_models("show", "--store", store).stdout)
    assert shown["version"] == "v0002" and shown["promotions"][0]["comment"] == "shadow clean"
    assert shown["evaluation"]["lines"] == len(log.lines) and 0 <= shown["evaluation"]["recall"] <= 1
    assert len(shown["evaluation"]["replay_sha256"]) == 64
    assert _models("rollback", "--store", store).stdout == "live: v0001 (rolled back)\n"
    bad = _models("promote", "--store", store, "v0009")
    assert bad.returncode == 2
    assert bad.stderr == f"error: model store {store}: no version 'v0009' (versions: v0001, v0002)\n"


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("{}", "exactly one of model.dir and model.store"),
        ("{dir: m, store: s}", "exactly one of model.dir and model.store"),
        ("{dir: m, shadow: v0002}", "model.shadow names a store version: it needs model.store"),
    ],
)
def test_serve_settings_take_a_dir_or_a_store(tmp_path: Path, model: str, reason: str) -> None:
    """serve reads a model directory or a store (with an optional shadow), never both."""
    from logstream.settings import SettingsError, load_settings

    config = tmp_path / "serve.yaml"
    config.write_text(f"model: {model}\nkafka: {{topics: [logs]}}\n")
    with pytest.raises(SettingsError, match=reason):
        load_settings(config)
    config.write_text("model: {store: s, shadow: v0002}\nkafka: {topics: [logs]}\n")
    assert load_settings(config).model.shadow == "v0002"


def _audit(path: Path, entries: list[tuple[str, bool, int, bool, str]]) -> None:
    """Audit lines as serve writes them: (model, shadow, offset, anomaly, template)."""
    with path.open("w") as f:
        for model, shadow, offset, anomaly, template in entries:
            entry = {"at": 1000.0 + offset, "source": "logs/0", "offset": offset, "stream": "web-1",
                     "kind": "line", "anomaly": anomaly, "template": template, "model": model}  # fmt: skip
            if shadow:
                entry["shadow"] = True
            f.write(json.dumps(entry) + "\n")


def test_compare_gates_on_rate_and_confirmed_anomalies(tmp_path: Path) -> None:
    """`models compare` reads live and shadow scores from the audit log: per model flagged per
    10k and the overlap; the gate fails (exit 1) when the candidate misses a template confirmed
    as an anomaly, or alerts more than --max-rate-ratio times as often; --since narrows it."""
    from logstream.lifecycle.feedback import Feedback, FeedbackStore

    db = tmp_path / "fb.sqlite"
    FeedbackStore(db).add(Feedback("anomaly", "ERROR disk <*> failed"))
    audit = tmp_path / "audit.jsonl"
    rows = [
        ("v1@a", False, i, i in (3, 7), "ERROR disk sda failed" if i == 3 else "GET <*>") for i in range(10)
    ]
    _audit(audit, rows + [("v2@b", True, i, i == 7, "GET <*>") for i in range(10)])
    failed = _models("compare", "--audit", audit, "--feedback", db)
    assert failed.returncode == 1, failed.stderr
    assert "live    v1@a  lines=10  flagged=2  per_10k=2000.0" in failed.stdout
    assert (
        "overlap=1 lines" in failed.stdout and "confirmed anomalies missed: 1; gate FAILED" in failed.stdout
    )
    _audit(audit, rows + [("v2@b", True, i, i in (3, 7), "ERROR disk sda failed") for i in range(10)])
    assert _models("compare", "--audit", audit, "--feedback", db).returncode == 0
    _audit(audit, rows + [("v2@b", True, i, i in (1, 2, 3, 7), "ERROR disk sda failed") for i in range(10)])
    noisy = _models("compare", "--audit", audit, "--max-rate-ratio", "1.5")
    assert noisy.returncode == 1 and "rate ratio 2.00" in noisy.stdout
    late = _models("compare", "--audit", audit, "--since", "1004", "--max-rate-ratio", "1.5")
    assert late.returncode == 0 and "lines=6" in late.stdout


def test_promote_with_a_gate_needs_a_passing_shadow_run_of_that_version(
    tmp_path: Path, synthetic_model_dir: Path
) -> None:
    """`models promote --gate-audit`: refused (exit 1, still the old live version) when the
    version's shadow run fails the gate, refused (exit 2) when the audit log has no shadow run
    of it, promoted when it passes."""
    store = tmp_path / "store"
    for _ in range(2):
        model_store.add(store, synthetic_model_dir)
    model_store.promote(store, "v0001")
    audit = tmp_path / "audit.jsonl"
    live = [("v0001@a", False, i, i == 7, "GET <*>") for i in range(10)]
    _audit(audit, live + [("v0002@b", True, i, i in (1, 2, 3, 7), "GET <*>") for i in range(10)])
    noisy = _models("promote", "--store", store, "v0002", "--gate-audit", audit)
    assert noisy.returncode == 1 and "gate FAILED" in noisy.stdout and model_store.live(store) == "v0001"
    other = _models("promote", "--store", store, "v0001", "--gate-audit", audit)
    assert other.returncode == 2 and "no shadow run of v0001" in other.stderr
    _audit(audit, live + [("v0002@b", True, i, i == 7, "GET <*>") for i in range(10)])
    passed = _models("promote", "--store", store, "v0002", "--gate-audit", audit)
    assert passed.returncode == 0, passed.stderr
    assert model_store.live(store) == "v0002"
