"""Raw HTTP over sockets for the tests of serve's ports: the bytes as sent, the answer as
received (where the bytes matter: lengths, half-sent requests), and the operators' tokens."""

from __future__ import annotations

import json
import socket

ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"


def exchange(port: int, data: bytes, *, finish: bool = True) -> bytes:
    """Send raw bytes, then (with `finish`) end the sending side; everything the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if finish:
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body(response: bytes) -> dict:
    return json.loads(response.partition(b"\r\n\r\n")[2])
