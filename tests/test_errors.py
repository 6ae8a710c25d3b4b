"""One error policy: what a user can fix is one line and exit 2; a bug keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from logstream.alerts.config import AlertConfigError
from logstream.alerts.outbox import OutboxError
from logstream.consumers.inputs import InputError
from logstream.engine.model import ModelDirError
from logstream.errors import UserError
from logstream.regex import RegexError
from logstream.settings import SettingsError


@pytest.mark.parametrize(
    "error", [InputError, ModelDirError, SettingsError, RegexError, AlertConfigError, OutboxError]
)
def test_every_user_fixable_error_is_a_user_error(error: type[Exception]) -> None:
    assert issubclass(error, UserError)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", *map(str, args)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_user_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = _cli("replay", tmp_path / "missing.log")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_too_little_training_data_is_a_user_error(tmp_path: Path) -> None:
    log = tmp_path / "three.log"
    log.write_text("a\nb\nc\n")
    result = _cli("train", log, "--out", tmp_path / "model", "--preset", "tiny", "--max-steps", "5")
    assert result.returncode == 2, result.stderr
    last = result.stderr.splitlines()[-1]  # after training's progress bar
    assert last.startswith("error: calibration: ") and "Traceback" not in result.stderr


def test_a_bad_duration_for_a_silence_is_a_user_error(tmp_path: Path) -> None:
    routes = tmp_path / "alerts.yaml"
    routes.write_text(
        "route: {receiver: r}\nreceivers: [{name: r, webhook_configs: [{url: 'http://127.0.0.1:9/'}]}]\n"
        f"delivery: {{outbox: {tmp_path / 'outbox.sqlite'}}}\n"
    )
    result = _cli("alerts", "silence", "add", "--alerts", routes, "--match", 'stream="a"', "--for", "soon")
    assert result.returncode == 2 and result.stderr.startswith("error: --for:"), result.stderr
