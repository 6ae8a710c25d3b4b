"""The incident memory on serve's feedback port (logstream.http_api), a real server on
127.0.0.1 spoken to over raw sockets: every route needs a bearer token, a resolution's
author is the token's user, its body is read no further than its bounded Content-Length,
an unknown fingerprint is 404, and search and show answer what the CLI answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from http_support import ALICE, BOB, body, exchange, status
from kafka_broker import free_port

from logstream.http_api import FeedbackEndpoint, load_tokens
from logstream.lifecycle.feedback import FeedbackRules, FeedbackStore
from logstream.memory.retrieval import IncidentMemory
from logstream.memory.store import Incident
from logstream.metrics import BoundedWSGIServer, HttpLimits, start_server

DISK = "ERROR <TS> storage: Failed to write <PATH>: No space left on device"
OOM = "CRITICAL <TS> kernel: Out of memory: Kill process <NUM> (java) score <NUM> or sacrifice child"
FIRST, SECOND = "logstream-" + "1" * 32, "logstream-" + "2" * 32


@dataclass
class Port:
    port: int
    memory: IncidentMemory
    server: BoundedWSGIServer


@pytest.fixture
def port(tmp_path: Path) -> Iterator[Port]:
    """The feedback port with alice's and bob's tokens and a memory of two disk-full
    incidents (a day apart) and an out-of-memory one."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    path = tmp_path / "outbox.sqlite"
    memory = IncidentMemory(path)
    memory.record(Incident(FIRST, first_seen=1.0, last_seen=1.0, streams=("prod-api",), templates=(DISK,)))
    memory.record(Incident("logstream-" + "3" * 32, first_seen=2.0, last_seen=2.0, templates=(OOM,)))
    memory.record(
        Incident(SECOND, first_seen=86401.0, last_seen=86401.0, streams=("prod-web",), templates=(DISK,))
    )
    store = FeedbackStore(path)
    endpoint = FeedbackEndpoint(store, FeedbackRules(store, refresh_seconds=3600), load_tokens(tokens), False)
    endpoint.incidents = memory
    number = free_port()
    server = start_server("127.0.0.1", number, endpoint, "feedback", HttpLimits(timeout_seconds=30))
    yield Port(number, memory, server)
    server.shutdown()
    server.server_close()
    memory.close()


def request(
    port: int, method: str, target: str, token: str | None = ALICE, content: bytes | None = None
) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    length = f"Content-Length: {len(content)}\r\n" if content is not None else ""
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}{length}\r\n"
    return exchange(port, head.encode() + (content or b""))


def resolution(port: int, fingerprint: str, payload: object, token: str | None = ALICE) -> bytes:
    return request(port, "POST", f"/incidents/{fingerprint}/resolution", token, json.dumps(payload).encode())


def test_every_incident_route_needs_a_known_token(port: Port) -> None:
    """Search, show and resolve without a token, or with one nobody has, are 401; nothing is
    written."""
    for token in (None, "nobody-0123456789abcdef"):
        assert status(request(port.port, "GET", "/incidents/search?q=disk", token)) == 401
        assert status(request(port.port, "GET", f"/incidents/{FIRST}", token)) == 401
        assert status(resolution(port.port, FIRST, {"text": "rotated the volume"}, token)) == 401
    assert port.memory.store.get(FIRST).resolution == ""  # type: ignore[union-attr]


def test_a_resolution_is_stored_as_by_the_tokens_user(port: Port) -> None:
    """POST /incidents/FP/resolution stores the text with bob as its author (his token); a
    body naming someone else is refused."""
    answer = resolution(port.port, FIRST, {"text": "moved the backup's staging dir"}, BOB)
    assert status(answer) == 200, answer
    assert (body(answer)["incident"]["resolution"], body(answer)["incident"]["resolved_by"]) == (
        "moved the backup's staging dir",
        "bob",
    )
    forged = resolution(port.port, FIRST, {"text": "x", "by": "carol"})
    assert status(forged) == 400
    kept = port.memory.store.get(FIRST)
    assert kept is not None and (kept.resolution, kept.resolved_by) == (
        "moved the backup's staging dir",
        "bob",
    )


def test_an_unknown_fingerprint_is_404(port: Port) -> None:
    """Show and resolve of a fingerprint the memory does not hold: 404 naming it."""
    missing = "logstream-" + "f" * 32
    shown = request(port.port, "GET", f"/incidents/{missing}")
    assert status(shown) == 404 and missing in body(shown)["error"]
    assert status(resolution(port.port, missing, {"text": "rotated the volume"})) == 404


def test_a_huge_content_length_is_413_before_any_body_arrives(port: Port) -> None:
    """A resolution announcing 1 TiB is answered 413 at once, without waiting for a body."""
    head = (
        f"POST /incidents/{FIRST}/resolution HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
        f"Content-Length: {2**40}\r\n\r\n"
    )
    assert status(exchange(port.port, head.encode(), finish=False)) == 413


def test_a_resolution_body_is_read_no_further_than_its_content_length(port: Port) -> None:
    """Bytes after the declared length are not part of the resolution."""
    content = json.dumps({"text": "rotated the volume"}).encode()
    head = (
        f"POST /incidents/{FIRST}/resolution HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    )
    answer = exchange(port.port, head.encode() + content + b"x" * 200_000)
    assert status(answer) == 200 and body(answer)["incident"]["resolution"] == "rotated the volume"


def test_a_bad_resolution_is_400_with_the_reason(port: Port) -> None:
    """Not JSON, no text, an empty text: 400 with a one-line reason; a missing length 411."""
    assert status(request(port.port, "POST", f"/incidents/{FIRST}/resolution", ALICE, b"{not json")) == 400
    assert status(resolution(port.port, FIRST, {"note": "x"})) == 400
    empty = resolution(port.port, FIRST, {"text": "  "})
    assert status(empty) == 400 and "empty" in body(empty)["error"]
    assert status(request(port.port, "POST", f"/incidents/{FIRST}/resolution")) == 411


def test_show_answers_the_incident_its_verdicts_and_the_incidents_like_it(port: Port) -> None:
    """GET /incidents/FP: the incident (with its resolution) and the earlier one like it."""
    port.memory.resolve(FIRST, "rotated the volume", by="alice")
    answer = request(port.port, "GET", f"/incidents/{SECOND}")
    assert status(answer) == 200
    shown = body(answer)
    assert shown["incident"]["fingerprint"] == SECOND and shown["incident"]["verdicts"] == []
    assert [(p["fingerprint"], p["resolution"]) for p in shown["similar"]] == [(FIRST, "rotated the volume")]


def test_search_finds_incidents_by_the_words_of_a_line(port: Port) -> None:
    """GET /incidents/search?q=LINE (URL-encoded): the disk-full incidents, not the other."""
    query = "Failed%20to%20write%20%2Fvar%2Flib%2Fx.log%3A%20No%20space%20left%20on%20device"
    answer = request(port.port, "GET", f"/incidents/search?q={query}")
    assert status(answer) == 200
    assert {p["fingerprint"] for p in body(answer)["incidents"]} == {FIRST, SECOND}
    assert status(request(port.port, "GET", "/incidents/search")) == 400


def test_a_route_with_another_method_is_405(port: Port) -> None:
    """GET on the resolution and POST on an incident are 405."""
    assert status(request(port.port, "GET", f"/incidents/{FIRST}/resolution")) == 405
    assert status(request(port.port, "POST", f"/incidents/{FIRST}", content=b"{}")) == 405


def test_without_a_memory_the_incident_routes_are_404(tmp_path: Path) -> None:
    """A feedback port without an incident memory (serve's sink is not alerts) answers 404."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\n")
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    endpoint = FeedbackEndpoint(store, FeedbackRules(store, refresh_seconds=3600), load_tokens(tokens), False)
    number = free_port()
    server = start_server("127.0.0.1", number, endpoint, "feedback", HttpLimits())
    try:
        answer = request(number, "GET", f"/incidents/{FIRST}")
        assert status(answer) == 404 and "no incident memory" in body(answer)["error"]
    finally:
        server.shutdown()
        server.server_close()
