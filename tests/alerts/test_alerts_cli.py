"""The CLI wiring: `logstream replay --alerts [--deliver]`, `logstream alerts check` and
`logstream alerts silence add|list|expire` (the one `silence`)."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from alerts_support import webhook, write_routes
from cli_support import logstream
from http_receivers import Receiver

from logstream.evaluation.synth import generate_lines

# These tests are about the wiring, not detection: at a false-alarm rate of 5% some of the 200
# scored lines of a clean log alert (the quiet default, 1e-3, may flag none of them).
REPLAY = ("--preset", "tiny", "--window", "64", "--max-steps", "10", "--false-alarm-rate", "0.05", "--json")


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("alerts-cli") / "all.log"
    path.write_text("\n".join(generate_lines(400, seed=13).lines) + "\n")
    return path


def _notifications(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The notification lines (on stderr with --json, which keeps stdout for the JSON)."""
    text = result.stdout + result.stderr
    return [line for line in text.splitlines() if " firing " in line or " resolved " in line]


def test_replay_alerts_dry_run_prints_alerts_and_sends_nothing(log_file: Path, tmp_path: Path) -> None:
    """--alerts alone prints one line per notification (each later resolved) and sends nothing."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        result = logstream("replay", log_file, *REPLAY, "--alerts", routes)
        sent = len(receiver.requests)
    assert result.returncode == 0, result.stderr
    lines = _notifications(result)
    assert lines and sent == 0
    assert sum(" firing " in line for line in lines) == sum(" resolved " in line for line in lines)
    assert all("team/webhook/0" in line for line in lines)
    assert "would send (dry run" in result.stderr


def test_replay_alerts_deliver_sends_what_the_dry_run_prints(log_file: Path, tmp_path: Path) -> None:
    """--deliver: the receiver gets exactly the printed notifications, each with its path:line
    (as tail's alerts carry it), template text, the lines before it, the model that raised it and the line's own time."""
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)])
        result = logstream("replay", log_file, *REPLAY, "--alerts", routes, "--deliver")
        received = receiver.ok()
    assert result.returncode == 0, result.stderr
    assert len(received) == len(_notifications(result)) > 0
    lines = log_file.read_text().splitlines()
    for request in received:
        alert = request.body["alerts"][0]
        notes = alert["annotations"]
        path, number_text = notes["source"].rsplit(":", 1)
        number = int(number_text)  # 1-based, as an editor counts
        assert path == str(log_file)
        assert lines[number - 1] == notes["first_line"] and notes["template"]
        assert notes["model_id"].startswith("replay-auto-train@") and notes["model_version"]
        assert notes["event_time"] and lines[number - 1].startswith(
            notes["event_time"].removesuffix("Z")[:19]
        )
        before = notes.get("context_before", "").splitlines()  # the log is one stream
        assert len(before) <= 2 and lines[number - 1 - len(before) : number - 1] == before
    assert any("context_before" in r.body["alerts"][0]["annotations"] for r in received)


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


def test_silence_add_list_expire_use_the_outbox_database(tmp_path: Path) -> None:
    """`alerts silence add` stores a silence in the outbox DB; `list` shows it; `expire` ends it."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    added = logstream(
        "alerts", "silence", "add", "--alerts", routes, "-m", 'stream=~"prod-db.*"', "-m", "severity!=warning",
        "--for", "90m", "-c", "failover drill", "--by", "ana",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    silence_id = added.stdout.split(":")[0]
    listed = logstream("alerts", "silence", "list", "--alerts", routes)
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    assert line.startswith(silence_id) and " active " in line
    assert '{stream=~"prod-db.*", severity!="warning"} by ana: failover drill' in line
    with sqlite3.connect(tmp_path / "outbox.sqlite") as db:
        assert db.execute("SELECT id FROM silences").fetchall() == [(silence_id,)]
    expired = logstream("alerts", "silence", "expire", "--alerts", routes, silence_id)
    assert expired.returncode == 0, expired.stderr
    assert logstream("alerts", "silence", "list", "--alerts", routes).stdout == ""
    again = logstream("alerts", "silence", "list", "--alerts", routes, "--expired")
    assert " expired " in again.stdout


def test_silence_expire_of_an_unknown_id_is_one_error_line(tmp_path: Path) -> None:
    """Expiring an id that is not in effect: exit 2 and one line saying so."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    result = logstream("alerts", "silence", "expire", "--alerts", routes, "nope")
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: no silence 'nope' in effect (see `logstream alerts silence list`)"
    )


def test_silence_refuses_a_glob_under_exact_equality(tmp_path: Path) -> None:
    """`stream=prod-db*` (an older release's glob) is refused with the =~ spelling to use."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    result = logstream(
        "alerts", "silence", "add", "--alerts", routes, "--match", "stream=prod-db*", "--for", "1h"
    )
    assert result.returncode == 2
    assert 'stream=~"prod-db.*"' in result.stderr and result.stderr.count("\n") == 1


def test_legacy_silences_file_is_imported_into_the_outbox(tmp_path: Path) -> None:
    """A silences_file from an older release is imported once, and its entries can be expired."""
    silences = tmp_path / "silences.yaml"
    old = [
        {"matchers": {"stream": "prod-db*"}, "starts_at": 0, "expires_at": 4_000_000_000, "comment": "old"}
    ]
    silences.write_text(yaml.safe_dump(old))
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")], silences_file=str(silences))
    first = logstream("alerts", "silence", "list", "--alerts", routes)
    assert first.returncode == 0, first.stderr
    (line,) = first.stdout.splitlines()
    assert line.startswith("file-") and "{stream=prod-db*}" in line and line.endswith(": old")
    silence_id = line.split()[0]
    assert logstream("alerts", "silence", "expire", "--alerts", routes, silence_id).returncode == 0
    assert logstream("alerts", "silence", "list", "--alerts", routes).stdout == ""  # not re-imported


def test_alerts_check_needs_no_secrets_and_lists_every_problem(tmp_path: Path) -> None:
    """`alerts check` passes without the env secrets; a broken file gets all its errors at once."""
    routes = write_routes(tmp_path, [{"name": "team", "webhook_configs": [{"url": "${NOT_SET_ANYWHERE}"}]}])
    ok = logstream("alerts", "check", routes)
    assert ok.returncode == 0, ok.stderr
    resolved = logstream("alerts", "check", routes, "--resolve-secrets")
    assert resolved.returncode == 2 and "NOT_SET_ANYWHERE is not set" in resolved.stderr
    doc = yaml.safe_load(routes.read_text())
    doc["route"]["receiver"] = "pager"
    doc["route"]["group_wait"] = "soon"
    doc["route"]["routes"] = [{"matchers": ["host=web"], "receiver": "team"}]
    routes.write_text(yaml.safe_dump(doc))
    bad = logstream("alerts", "check", routes)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    for problem in (
        "route.receiver: unknown receiver 'pager'",
        "route.group_wait: not a duration",
        "unknown label 'host'",
    ):
        assert problem in bad.stderr
    assert "more)" not in bad.stderr


def test_serve_check_also_checks_the_routes_file_without_secrets(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """`serve --check` with sink kind alerts loads the routes file too: unresolvable secrets
    pass (not needed to check), a wrong receiver fails with one line and exit 2."""
    routes = write_routes(tmp_path, [{"name": "team", "webhook_configs": [{"url": "${NOT_SET_ANYWHERE}"}]}])
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"dir": str(synthetic_model_dir)},
                "kafka": {"topics": ["t"]},
                "sink": {"kind": "alerts", "routes": str(routes)},
            }
        )
    )
    assert logstream("serve", "--config", config, "--check").returncode == 0
    doc = yaml.safe_load(routes.read_text())
    doc["route"]["receiver"] = "pager"
    routes.write_text(yaml.safe_dump(doc))
    bad = logstream("serve", "--config", config, "--check")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown receiver 'pager'" in bad.stderr
