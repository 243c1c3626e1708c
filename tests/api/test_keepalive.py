"""An idle connection outlives the clients' own pool expiry (httpx: 5 s), so a client never
reuses a connection the server is closing at that very moment."""

from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import API_KEY, Server

pytestmark = pytest.mark.engine  # starts vLLM engines


def _get(sock: socket.socket) -> bytes:
    sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = int(lengths[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_idle_connection_survives_six_seconds(server: Server) -> None:
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert _get(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        assert _get(sock).startswith(b"HTTP/1.1 200")
