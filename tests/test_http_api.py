"""`POST /feedback` and the bounded HTTP servers (logstream.http_api, logstream.metrics),
each a real server on 127.0.0.1 spoken to over raw sockets: body reads bounded by the
Content-Length, connections capped with a thread each, half-sent requests dropped, the
author taken from the token (with the caller's address), rules scoped and expiring, an
anomaly overriding a normal, a fingerprint of several templates answered with the list."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alerts_support import FakeClock, anomaly, webhook, write_routes
from feedback_support import locked
from http_support import ALICE, BOB, body, exchange, read_all, status
from kafka_broker import free_port

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.http_api import FeedbackEndpoint, load_tokens
from logstream.lifecycle.feedback import FeedbackRules, FeedbackStore
from logstream.metrics import BoundedWSGIServer, Health, HttpLimits, serve_http, start_server
from logstream.settings import SettingsError, load_settings

TEMPLATE = "WARN cache: evicted <NUM> keys under memory pressure"
OOM = "<TS> <HOST> kernel: Out of memory: Killed process <NUM> (<*>)"


def post(port: int, payload: object, token: str | None = ALICE) -> bytes:
    """A well-formed POST /feedback with a JSON body (and the bearer token, if any)."""
    content = json.dumps(payload).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"POST /feedback HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
    return exchange(port, f"{head}Content-Length: {len(content)}\r\n\r\n".encode() + content)


@dataclass
class Running:
    port: int
    endpoint: FeedbackEndpoint
    server: BoundedWSGIServer


def _serve(
    tmp_path: Path, tokens: dict[str, str] | None, allow: bool, limits: HttpLimits, store_timeout: float = 5.0
) -> Running:
    store = FeedbackStore(tmp_path / "outbox.sqlite", timeout=store_timeout)
    endpoint = FeedbackEndpoint(store, FeedbackRules(store, refresh_seconds=3600), tokens, allow)
    port = free_port()
    return Running(port, endpoint, start_server("127.0.0.1", port, endpoint, "feedback", limits))


@pytest.fixture
def feedback(tmp_path: Path) -> Iterator[Running]:
    """The feedback port with alice's and bob's tokens."""
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# operators\nalice:{ALICE}\n\nbob:{BOB}\n")
    running = _serve(tmp_path, load_tokens(tokens_file), False, HttpLimits(timeout_seconds=30))
    yield running
    running.server.shutdown()
    running.server.server_close()


def test_content_length_minus_one_is_refused_without_reading_on(feedback: Running) -> None:
    """`Content-Length: -1` (read as "until the client closes") is a 400, and nothing is
    stored."""
    content = json.dumps({"verdict": "normal", "template": TEMPLATE}).encode()
    head = (
        f"POST /feedback HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: -1\r\n\r\n"
    )
    answer = exchange(feedback.port, head.encode() + content)
    assert status(answer) == 400 and "Content-Length" in body(answer)["error"]
    assert feedback.endpoint.store.listed() == []


def test_a_missing_content_length_is_411(feedback: Running) -> None:
    """A body without a Content-Length (read until close, or chunked) is 411 Length Required."""
    content = json.dumps({"verdict": "normal", "template": TEMPLATE}).encode()
    head = f"POST /feedback HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n"
    assert status(exchange(feedback.port, head.encode() + content)) == 411
    assert feedback.endpoint.store.listed() == []


def test_a_huge_content_length_is_413_before_any_body_arrives(feedback: Running) -> None:
    """A 1 TiB Content-Length is answered 413 at once: the client has sent no body and has not
    closed its side, so a server that tried to read it would not answer."""
    head = f"POST /feedback HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: {2**40}\r\n\r\n"
    answer = exchange(feedback.port, head.encode(), finish=False)
    assert status(answer) == 413


def test_the_body_is_read_no_further_than_its_content_length(feedback: Running) -> None:
    """Bytes after the declared length are never read as part of the verdict."""
    content = json.dumps({"verdict": "normal", "template": TEMPLATE}).encode()
    head = f"POST /feedback HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: {len(content)}\r\n\r\n"
    answer = exchange(feedback.port, head.encode() + content + b"x" * 200_000)
    assert status(answer) == 201
    assert [f.template for f in feedback.endpoint.store.listed()] == [TEMPLATE]


def test_the_author_is_the_tokens_user_with_the_callers_address(feedback: Running) -> None:
    """Each token stores its own user's name and 127.0.0.1; a caller-chosen `by` is refused."""
    for token, name in ((ALICE, "alice"), (BOB, "bob")):
        answer = post(feedback.port, {"verdict": "normal", "template": TEMPLATE}, token)
        assert status(answer) == 201, answer
        (stored,) = body(answer)["stored"]
        assert (stored["created_by"], stored["remote"]) == (name, "127.0.0.1")
    forged = post(feedback.port, {"verdict": "normal", "template": TEMPLATE, "by": "carol"})
    assert status(forged) == 400 and "by: unknown field" in body(forged)["error"]
    assert [f.created_by for f in feedback.endpoint.store.listed()] == ["alice", "bob"]


def test_an_unknown_token_is_401_and_stores_nothing(feedback: Running) -> None:
    """No token, a token nobody has, or another scheme: 401."""
    for token in (None, "nobody-0123456789abcdef"):
        assert status(post(feedback.port, {"verdict": "normal", "template": TEMPLATE}, token)) == 401
    assert feedback.endpoint.store.listed() == []


def test_a_rule_without_literal_text_is_400(feedback: Running) -> None:
    """`<TS> <*> <*>` over HTTP: 400 with the reason."""
    answer = post(feedback.port, {"verdict": "normal", "template": "<TS> <*> <*>"})
    assert status(answer) == 400 and "literal text" in body(answer)["error"]


def test_a_scoped_expiring_verdict_applies_to_its_streams_until_it_expires(feedback: Running) -> None:
    """`stream` and `for` are stored; the rule covers db-1 and not web-1, and not after 2 h."""
    before = time.time()
    answer = post(feedback.port, {"verdict": "normal", "template": OOM, "stream": "db-*", "for": "2h"})
    assert status(answer) == 201, answer
    (stored,) = body(answer)["stored"]
    assert stored["stream"] == "db-*" and before + 7200 <= stored["expires_at"] <= time.time() + 7200
    rules = feedback.endpoint.rules
    assert rules.verdict(OOM, "db-1") == "normal" and rules.verdict(OOM, "web-1") is None
    assert rules.verdict(OOM, "db-1", now=stored["expires_at"]) is None


def test_an_anomaly_verdict_overrides_a_broader_normal(feedback: Running) -> None:
    """A "normal" on a wide template, then an "anomaly" on a narrower one it covers: the
    narrower lines are anomalies at once, the others stay normal."""
    wide = "<TS> <HOST> kernel: Out of <*> Killed process <NUM> (<*>)"
    assert status(post(feedback.port, {"verdict": "normal", "template": wide})) == 201
    assert status(post(feedback.port, {"verdict": "anomaly", "template": OOM})) == 201
    rules = feedback.endpoint.rules
    assert rules.verdict(OOM, "db-1") == "anomaly"
    assert rules.verdict(OOM.replace("memory:", "swap:"), "db-1") == "normal"


def test_a_fingerprint_of_several_templates_is_409_with_the_list(tmp_path: Path) -> None:
    """A group holding two templates: 409 naming both, nothing stored; `template: 2` stores
    the second; `all` stores both."""
    routes = write_routes(tmp_path, [webhook("hook", "http://127.0.0.1:9")], route={"group_by": ["stream"]})
    config = load_config(routes, secrets=False)
    outbox = Outbox(config.delivery.outbox, config, clock=FakeClock())
    second = "Nov 9 12:01:02 db-1 sshd[812]: Failed password for root from 10.0.0.7 port 52211 ssh2"
    outbox.put([anomaly(template_id=3), anomaly(template_id=4, line=second)])
    fingerprint = outbox.flush(FakeClock().now + 1)[0].dedup_key
    outbox.close()
    running = _serve(tmp_path, None, True, HttpLimits())
    try:
        asked = post(running.port, {"verdict": "normal", "fingerprint": fingerprint}, None)
        assert status(asked) == 409 and len(body(asked)["templates"]) == 2
        assert running.endpoint.store.listed() == []
        picked = post(running.port, {"verdict": "normal", "fingerprint": fingerprint, "template": 2}, None)
        assert [s["line"] for s in body(picked)["stored"]] == [second]
        both = post(running.port, {"verdict": "anomaly", "fingerprint": fingerprint, "all": True}, None)
        assert [s["template"] for s in body(both)["stored"]] == body(asked)["templates"]
        assert {s["created_by"] for s in body(both)["stored"]} == {"anonymous"}
    finally:
        running.server.shutdown()
        running.server.server_close()


def test_a_post_while_the_database_is_locked_is_503_and_a_retry_stores_it(tmp_path: Path) -> None:
    """Another process holds the database: 503 with the reason, nothing stored; once it lets
    go the same POST is 201."""
    running = _serve(tmp_path, None, True, HttpLimits(), store_timeout=0.1)
    try:
        with locked(tmp_path / "outbox.sqlite"):
            answer = post(running.port, {"verdict": "normal", "template": TEMPLATE}, None)
            assert status(answer) == 503 and "locked" in body(answer)["error"]
        assert status(post(running.port, {"verdict": "normal", "template": TEMPLATE}, None)) == 201
        assert len(running.endpoint.store.listed()) == 1
    finally:
        running.server.shutdown()
        running.server.server_close()


def test_without_tokens_the_endpoint_is_closed(tmp_path: Path) -> None:
    """No tokens file and not opened on purpose: 403, nothing stored."""
    running = _serve(tmp_path, None, False, HttpLimits())
    try:
        answer = post(running.port, {"verdict": "normal", "template": TEMPLATE}, None)
        assert status(answer) == 403 and "tokens_file" in body(answer)["error"]
        assert running.endpoint.store.listed() == []
    finally:
        running.server.shutdown()
        running.server.server_close()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("alice\n", "expected name:token"),
        ("alice:short\n", "16 characters"),
        (f"alice:{ALICE}\nbob:{ALICE}\n", "also alice's"),
        ("# nobody\n", "no name:token line"),
    ],
)
def test_a_bad_tokens_file_is_one_line_naming_the_line(tmp_path: Path, text: str, reason: str) -> None:
    """A tokens file that is not name:token lines (16+ characters, each token one user's)
    fails at start with the file and line."""
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(SettingsError, match=reason):
        load_tokens(path)


def _half_sent(port: int) -> socket.socket:
    """A connection that sent half a request and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /feedback HTTP/1.1\r\nHost: x\r\nContent-Len")
    return sock


def _request_threads(name: str) -> int:
    return sum(t.name == f"logstream-{name}-request" for t in threading.enumerate())


def _wait_until(condition: object, what: str) -> None:
    for _ in range(600):  # bounded: 60 s at most
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("name", ["metrics", "feedback"])
def test_half_sent_requests_hold_at_most_max_connections_threads(tmp_path: Path, name: str) -> None:
    """Ten clients that send half a request: four (the cap) hold a thread each, the other six
    are answered 503 at once; once the four go, the port answers again."""
    limits = HttpLimits(timeout_seconds=30, max_connections=4)
    if name == "metrics":
        port = free_port()
        server = serve_http("127.0.0.1", port, Health(model_loaded=True), limits)
        path = b"/healthz"
    else:
        running = _serve(tmp_path, None, True, limits)
        port, server, path = running.port, running.server, b"/feedback"
    try:
        slow = [_half_sent(port) for _ in range(4)]
        _wait_until(lambda: server.active == 4, "four requests in hand")
        refused = [exchange(port, b"", finish=False) for _ in range(6)]
        assert [status(r) for r in refused] == [503] * 6
        assert _request_threads(name) == 4 and server.active == 4
        for sock in slow:
            sock.close()
        _wait_until(lambda: server.active == 0, "the slow requests to end")
        answer = exchange(port, b"GET " + path + b" HTTP/1.0\r\n\r\n")
        assert status(answer) in (200, 405)
    finally:
        server.shutdown()
        server.server_close()


def test_a_half_sent_request_is_dropped_after_the_timeout(tmp_path: Path) -> None:
    """A request that stops half-way is closed by the server after timeout_seconds and its
    thread freed."""
    running = _serve(tmp_path, None, True, HttpLimits(timeout_seconds=0.2, max_connections=2))
    try:
        with _half_sent(running.port) as sock:
            assert read_all(sock) == b""  # closed by the server, not by this client
        _wait_until(lambda: running.server.active == 0, "the thread to end")
    finally:
        running.server.shutdown()
        running.server.server_close()


def test_feedback_is_not_served_on_the_metrics_port() -> None:
    """The metrics port answers /metrics and the probes only: /feedback there is a 404."""
    port = free_port()
    server = serve_http("127.0.0.1", port, Health(model_loaded=True))
    try:
        answer = exchange(port, b"POST /feedback HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
        assert status(answer) == 404
    finally:
        server.shutdown()
        server.server_close()


def test_feedback_and_metrics_on_one_port_is_a_settings_error(tmp_path: Path) -> None:
    """feedback.port equal to http.port fails at start, naming both."""
    config = tmp_path / "serve.yaml"
    config.write_text(
        "model: {dir: m}\nkafka: {topics: [t]}\nhttp: {port: 9000}\nfeedback: {port: 9000}\n",
        encoding="utf-8",
    )
    with pytest.raises(SettingsError, match=r"feedback\.port must differ from http\.port"):
        load_settings(config)
