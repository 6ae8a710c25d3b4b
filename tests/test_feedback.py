"""Operator feedback (logstream.feedback): stored with who/when/why, obeyed at scoring time at
once and after a restart, shared through the database, taken by `POST /feedback` only with
the token, and resolved from what an operator has at hand (a fingerprint, a path:line)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alerts_support import FakeClock, anomaly, webhook, write_routes
from kafka_broker import free_port

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.detector import Detector, ScoredLine
from logstream.feedback import Feedback, FeedbackError, FeedbackRules, FeedbackStore, Target
from logstream.feedback_cli import give
from logstream.feedback_http import FeedbackEndpoint
from logstream.inputs import parse_lines
from logstream.metrics import Health, serve_http
from logstream.synth import STREAM_KEY, generate_lines


def _score(detector: Detector, lines: list[str]) -> list[ScoredLine]:
    detector.reset()
    return detector.score(parse_lines(lines, STREAM_KEY))


@pytest.fixture(scope="module")
def incident_log() -> tuple[list[str], list[str | None]]:
    log = generate_lines(600, seed=7, incidents=("new_template", "unseen_value") * 3)
    return log.lines, log.kinds


def test_normal_verdict_suppresses_its_template_at_once_and_after_a_restart(
    synthetic_model_dir: Path, incident_log: tuple[list[str], list[str | None]], tmp_path: Path
) -> None:
    """A "normal" verdict on a flagged line's template stops every line of that template from
    alerting from the next refresh on (scores unchanged, marked suppressed), other incidents
    still alert, and a freshly loaded detector on the same database obeys it from its start."""
    lines, kinds = incident_log
    detector = Detector.load(synthetic_model_dir, device="cpu", false_alarm_rate=5e-3)
    before = _score(detector, lines)
    flagged = [s for s, k in zip(before, kinds, strict=True) if k == "new_template" and s.is_anomaly]
    assert flagged, "the model must flag the new-template incident for this test to mean anything"
    db = tmp_path / "outbox.sqlite"
    clock = FakeClock()
    detector.feedback = FeedbackRules(FeedbackStore(db), refresh_seconds=5, clock=clock)
    made = give(
        "normal", db, Target(line=flagged[0].record.line), normalizer=detector.normalizer,
        created_by="alice", comment="known pool warning",
    )  # fmt: skip
    assert (made.verdict, made.created_by, made.comment) == ("normal", "alice", "known pool warning")
    assert made.created_at > 0 and made.target.startswith("line:")

    def check(after: list[ScoredLine]) -> None:
        marked = [a for a, k in zip(after, kinds, strict=True) if k == "new_template"]
        assert not any(a.is_anomaly for a in marked)
        assert any(a.suppressed and a.score > a.threshold for a in marked)
        others = [a.is_anomaly for a, k in zip(after, kinds, strict=True) if k == "unseen_value"]
        was = [b.is_anomaly for b, k in zip(before, kinds, strict=True) if k == "unseen_value"]
        assert others == was

    clock.advance(5)  # the CLI wrote it; a running detector reads it at its next refresh
    check(_score(detector, lines))
    restarted = Detector.load(synthetic_model_dir, device="cpu", false_alarm_rate=5e-3)
    restarted.feedback = FeedbackRules(FeedbackStore(db))
    check(_score(restarted, lines))


def test_latest_verdict_wins_and_replicas_see_it_at_their_refresh(tmp_path: Path) -> None:
    """Two processes' rules on one database: a verdict written through one is in effect in the
    other at its next refresh (not before), and "anomaly" after "normal" undoes it."""
    db = tmp_path / "shared.sqlite"
    clock = FakeClock()
    writer, reader = FeedbackStore(db), FeedbackStore(db)
    rules = FeedbackRules(reader, refresh_seconds=5, clock=clock)
    template = "INFO job <NUM>: step <*> rows=<NUM>"
    writer.add(Feedback("normal", template, created_by="bob"))
    rules.refresh()
    assert not rules.is_normal(template)  # read at start; the next read is due in 5 s
    clock.advance(5)
    rules.refresh()
    assert rules.is_normal(template)
    assert rules.is_normal("INFO job <NUM>: step fetch rows=<NUM>")  # Drain's narrower form
    assert not rules.is_normal("INFO job <NUM>: step fetch")  # another shape
    writer.add(Feedback("anomaly", template, created_by="carol"))
    clock.advance(5)
    rules.refresh()
    assert not rules.is_normal(template)
    assert [f.verdict for f in reader.listed()] == ["normal", "anomaly"]


def test_feedback_refuses_what_would_match_everything(tmp_path: Path) -> None:
    """A template of only wildcards, an unknown verdict, or no target at all is a one-line error."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    with pytest.raises(FeedbackError, match="only wildcards"):
        store.add(Feedback("normal", "<*> <*>"))
    with pytest.raises(FeedbackError, match="verdict"):
        store.add(Feedback("fine", "GET <*>"))
    with pytest.raises(FeedbackError, match="exactly one"):
        give("normal", tmp_path / "f.sqlite", Target())
    with pytest.raises(FeedbackError, match="needs the model"):
        give("normal", tmp_path / "f.sqlite", Target(line="GET /x 200"))


def test_fingerprint_resolves_through_the_outbox(tmp_path: Path) -> None:
    """An alert's fingerprint (its dedup_key) names the template, first line and model of its
    group in the outbox that raised it; the verdict lands in that same database."""
    routes = write_routes(tmp_path, [webhook("hook", "http://127.0.0.1:9")])
    config = load_config(routes, secrets=False)
    outbox = Outbox(config.delivery.outbox, config, clock=FakeClock())
    outbox.put([anomaly(template_id=3)])
    alert = outbox.flush(FakeClock().now + 1)[0]
    outbox.close()
    made = give("normal", Path(config.delivery.outbox), Target(fingerprint=alert.dedup_key))
    assert made.template == alert.template_text and made.line == alert.first_line
    assert made.model == "tiny-test-model"
    with pytest.raises(FeedbackError, match="no such alert"):
        give("normal", Path(config.delivery.outbox), Target(fingerprint="logstream-nope"))


def test_cli_marks_a_file_line_normal(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """`logstream feedback normal --at path:line --model DIR` masks that line with the model's
    rules and stores it; `feedback list` shows it; a bad target is one line, exit 2."""
    log = tmp_path / "app.log"
    log.write_text("first line\nERROR db: connection pool exhausted after 5000ms\n")
    db = tmp_path / "fb.sqlite"
    base = [sys.executable, "-m", "logstream.cli", "feedback"]
    done = subprocess.run(
        [*base, "normal", "--db", db, "--model", synthetic_model_dir, "--at", f"{log}:2", "-c", "why"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "normal: ERROR db: connection pool exhausted after" in done.stdout
    listed = subprocess.run([*base, "list", "--db", db], capture_output=True, text=True, timeout=120)
    assert '"comment": "why"' in listed.stdout and f'"target": "at:{log}:2"' in listed.stdout
    bad = subprocess.run(
        [*base, "normal", "--db", db, "--model", synthetic_model_dir, "--at", f"{log}:9"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip() == f"error: {log} has fewer than 9 lines"


@pytest.fixture
def endpoint_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, FeedbackEndpoint]]:
    """serve's real HTTP server on 127.0.0.1 with /feedback; `request.param`: (token, open)."""
    token, allow = request.param
    store = FeedbackStore(tmp_path / "fb.sqlite")
    endpoint = FeedbackEndpoint(store, FeedbackRules(store, refresh_seconds=3600), token, allow)
    port = free_port()
    server = serve_http("127.0.0.1", port, Health(model_loaded=True), {"/feedback": endpoint})
    yield f"http://127.0.0.1:{port}/feedback", endpoint
    server.shutdown()
    store.close()


BODY = {"verdict": "normal", "template": "WARN cache: evicted <NUM> keys under memory pressure", "by": "pd"}


@pytest.mark.parametrize("endpoint_server", [("s3cret", False)], indirect=True)
def test_post_feedback_needs_the_token(endpoint_server: tuple[str, FeedbackEndpoint]) -> None:
    """With a token configured: no or a wrong bearer token is 401 and stores nothing; the right
    one is 201 and the template is normal for scoring at once (no refresh interval)."""
    url, endpoint = endpoint_server
    assert httpx.post(url, json=BODY).status_code == 401
    assert httpx.post(url, json=BODY, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert endpoint.store.listed() == []
    answer = httpx.post(url, json=BODY, headers={"Authorization": "Bearer s3cret"})
    assert answer.status_code == 201 and answer.json()["created_by"] == "pd"
    assert endpoint.rules.is_normal(BODY["template"])
    bad = httpx.post(url, json={**BODY, "at": "/etc/passwd:1"}, headers={"Authorization": "Bearer s3cret"})
    assert bad.status_code == 400 and "unknown field" in bad.json()["error"]
    assert httpx.get(url).status_code == 405


@pytest.mark.parametrize("endpoint_server", [(None, False)], indirect=True)
def test_post_feedback_without_a_token_is_closed(endpoint_server: tuple[str, FeedbackEndpoint]) -> None:
    """No token configured (and not opened on purpose): 403, nothing stored."""
    url, endpoint = endpoint_server
    answer = httpx.post(url, json=BODY)
    assert answer.status_code == 403 and "feedback.token" in answer.json()["error"]
    assert endpoint.store.listed() == []


@pytest.mark.parametrize("endpoint_server", [(None, True)], indirect=True)
def test_post_feedback_opened_without_a_token(endpoint_server: tuple[str, FeedbackEndpoint]) -> None:
    """allow_without_token opens it; a body that is not a verdict is a 400 with the reason."""
    url, endpoint = endpoint_server
    assert httpx.post(url, json=BODY).status_code == 201
    assert httpx.post(url, content=b"{not json").status_code == 400
    wrong = httpx.post(url, json={"verdict": "maybe", "template": "a b"})
    assert wrong.status_code == 400 and "verdict" in wrong.json()["error"]
    assert [f.template for f in endpoint.store.listed()] == [BODY["template"]]
