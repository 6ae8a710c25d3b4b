"""Real HTTP receivers on 127.0.0.1 that fail on purpose, for the alert delivery tests and the chaos run.

A `Receiver` is a ThreadingHTTPServer in a daemon thread. A script decides each
answer from the request and how many times this idempotency key was seen:
reply with a status (and headers, after a delay), or drop the connection
mid-response. Every request is recorded with its arrival time, headers, JSON
body and the answer given.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0  # seconds before answering (past the client's timeout = "slow")


@dataclass(frozen=True)
class Drop:
    """Send the status line and part of the body, then close: a response cut short."""


Action = Reply | Drop
Script = Callable[["Received", int], Action]  # (request, nth time this key was seen, 1-based)


@dataclass(frozen=True)
class Received:
    at: float
    path: str
    headers: dict[str, str]
    body: Any
    answer: str = ""

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")


def always_ok(_request: Received, _nth: int) -> Action:
    return Reply()


def fail_first(n: int, action: Action) -> Script:
    """Answer `action` to the first `n` requests of each idempotency key, then 200."""
    return lambda _request, nth: action if nth <= n else Reply()


def free_port() -> int:
    """A port nothing listens on right now (connection refused until a receiver takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Receiver:
    """`with Receiver(script) as r:` ... `r.url`, `r.requests`, `r.wait_for(...)`."""

    def __init__(self, script: Script = always_ok, port: int = 0) -> None:
        self.script = script
        self.requests: list[Received] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def ok(self) -> list[Received]:
        """Requests answered 2xx."""
        with self._lock:
            return [r for r in self.requests if r.answer.startswith("2")]

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = 10.0) -> bool:
        """Poll until `predicate(self)` holds or `timeout` passes (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return predicate(self)

    def _record(self, received: Received) -> int:
        with self._lock:
            self._seen[received.key] = self._seen.get(received.key, 0) + 1
            return self._seen[received.key]

    def _answered(self, received: Received, answer: str) -> None:
        with self._lock:
            self.requests.append(
                Received(received.at, received.path, received.headers, received.body, answer)
            )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                received = Received(
                    at=time.time(),
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw) if raw else None,
                )
                action = receiver.script(received, receiver._record(received))
                if isinstance(action, Drop):
                    receiver._answered(received, "drop")
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                time.sleep(action.delay)
                receiver._answered(received, str(action.status))
                try:
                    self.send_response(action.status)
                    for name, value in action.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(action.body)))
                    self.end_headers()
                    self.wfile.write(action.body)
                except OSError:  # the client gave up (timeout) before the answer
                    self.close_connection = True

        return Handler
