"""The CLI wiring: `logstream replay --alerts [--deliver]` and `logstream silence`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from alerts_support import webhook, write_routes
from http_receivers import Receiver

from logstream.synth import generate_lines

# These tests are about the wiring, not detection: at a false-alarm rate of 5% some of the 200
# scored lines of a clean log alert (the quiet default, 1e-3, may flag none of them).
REPLAY = ("--preset", "tiny", "--window", "64", "--max-steps", "10", "--false-alarm-rate", "0.05", "--json")


def logstream(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("alerts-cli") / "all.log"
    path.write_text("\n".join(generate_lines(400, seed=13).lines) + "\n")
    return path


def _notifications(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if " firing " in line or " resolved " in line]


def test_replay_alerts_dry_run_prints_alerts_and_sends_nothing(log_file: Path, tmp_path: Path) -> None:
    """--alerts alone prints one line per notification (each later resolved) and sends nothing."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        result = logstream("replay", log_file, *REPLAY, "--alerts", routes)
        sent = len(receiver.requests)
    assert result.returncode == 0, result.stderr
    lines = _notifications(result.stdout)
    assert lines and sent == 0
    assert sum(" firing " in line for line in lines) == sum(" resolved " in line for line in lines)
    assert all("team/webhook/0" in line for line in lines)
    assert "would send (dry run" in result.stderr


def test_replay_alerts_deliver_sends_what_the_dry_run_prints(log_file: Path, tmp_path: Path) -> None:
    """--deliver: the receiver gets exactly the printed notifications."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        result = logstream("replay", log_file, *REPLAY, "--alerts", routes, "--deliver")
        received = receiver.ok()
    assert result.returncode == 0, result.stderr
    assert len(received) == len(_notifications(result.stdout)) > 0


def test_bad_routes_file_fails_before_scoring(log_file: Path, tmp_path: Path) -> None:
    """An unknown receiver in --alerts is one error line, exit 2, before any model work."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    doc = yaml.safe_load(routes.read_text())
    doc["route"]["receiver"] = "pager"
    routes.write_text(yaml.safe_dump(doc))
    result = logstream("replay", log_file, *REPLAY, "--alerts", routes)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown receiver 'pager'" in result.stderr


def test_deliver_without_alerts_is_cli_misuse(log_file: Path) -> None:
    """--deliver without --alerts: exit 2 with a one-line reason."""
    result = logstream("replay", log_file, *REPLAY, "--deliver")
    assert result.returncode == 2 and "--deliver needs --alerts" in result.stderr


def test_silence_command_writes_the_silences_file(tmp_path: Path) -> None:
    """`logstream silence` appends a silence with the matchers and an expiry to silences_file."""
    silences = tmp_path / "silences.yaml"
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], silences_file=str(silences))
    result = logstream(
        "silence", "--alerts", routes, "--match", "stream=prod-db*", "--match", "severity=warning",
        "--for", "90m", "--comment", "failover drill",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (saved,) = yaml.safe_load(silences.read_text())
    assert saved["matchers"] == {"stream": "prod-db*", "severity": "warning"}
    assert saved["expires_at"] - saved["starts_at"] == pytest.approx(5400)
    assert saved["comment"] == "failover drill"
