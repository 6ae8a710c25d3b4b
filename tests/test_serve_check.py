"""`logstream serve --config FILE --check`: the settings, and what they point at (the model or
store loads, the routes file parses), checked without Kafka; each problem named in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from logstream.lifecycle import model_store


def check(tmp_path: Path, model: dict[str, Any], **sections: Any) -> subprocess.CompletedProcess[str]:
    """`serve --check` on a config with this model section; no broker listens at its address."""
    config = tmp_path / "serve.yaml"
    doc = {"model": model, "kafka": {"bootstrap_servers": "127.0.0.1:9", "topics": ["logs"]}, **sections}
    config.write_text(yaml.safe_dump(doc))
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", "serve", "--config", str(config), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_check_fails_on_a_model_dir_that_does_not_exist(tmp_path: Path) -> None:
    """A model.dir that does not exist fails the check (exit 2, one line naming the field and
    how to make one), though the settings' shape is right."""
    result = check(tmp_path, {"dir": str(tmp_path / "models" / "prod")})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert (
        f"model.dir: model directory {tmp_path / 'models' / 'prod'} does not exist; train one"
        in result.stderr
    )


def test_check_names_every_problem_a_store_as_model_dir_and_missing_routes(tmp_path: Path) -> None:
    """A model store given as model.dir (a version is expected there) and a routes file that is
    not there are both named, in one line: what each path is and what to give instead."""
    store = tmp_path / "store"
    (store / "versions").mkdir(parents=True)
    routes = tmp_path / "alerts.yaml"
    result = check(tmp_path, {"dir": str(store)}, sink={"kind": "alerts", "routes": str(routes)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"model.dir: {store} is a model store, not one model: give one of its versions" in result.stderr
    assert f"sink.routes: {routes}: cannot read" in result.stderr


def test_check_loads_the_store_s_live_version(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """A store whose live version loads passes, and the check says which version it loaded and
    that Kafka was not contacted (nothing listens at the configured broker)."""
    store = tmp_path / "store"
    model_store.promote(store, model_store.add(store, synthetic_model_dir))
    result = check(tmp_path, {"store": str(store)})
    assert result.returncode == 0, result.stderr
    assert f"model store {store}, live version v0001; Kafka not contacted" in result.stderr
