"""A client that goes away aborts its engine request: nothing keeps generating.

Evidence that cannot pass by luck: the engine's generated-token counter grows
by far less than the request's max_tokens, and the engine (scheduler and
frontend) is idle within seconds of the disconnect.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.conftest import API_KEY, DENSE, Server, open_post

pytestmark = pytest.mark.engine  # starts vLLM engines

MAX_TOKENS = 32000  # over a minute of work for the tiny CPU model if nothing aborts it
LONG = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 1.0}
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def engine(server: Server) -> dict:  # type: ignore[type-arg]
    return server.stats()["engines"][DENSE]  # type: ignore[no-any-return]


def wait_idle(server: Server, timeout: float = 60.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        s = engine(server)
        if s["stats"]["unfinished"] == 0 and s["stats"]["running"] == 0 and s["inflight"] == 0:
            return s
        if time.monotonic() > deadline:
            pytest.fail(f"engine still busy {timeout}s after the client left: {s}")
        time.sleep(0.1)


def test_full_request_generates_max_tokens(server: Server) -> None:
    """Control for the tests below: the same request, not abandoned, runs to the end."""
    before = wait_idle(server)["stats"]["generation_tokens"]
    body = {"model": DENSE, "messages": [{"role": "user", "content": "go"}], **LONG, "max_tokens": 300}
    r = httpx.post(f"{server.api}/chat/completions", json=body, headers=HEADERS, timeout=120)
    assert r.json()["usage"]["completion_tokens"] == 300
    assert wait_idle(server)["stats"]["generation_tokens"] - before == 300


def open_request(server: Server, payload: dict) -> socket.socket:  # type: ignore[type-arg]
    return open_post(server, "/v1/chat/completions", payload)


def test_stream_disconnect_aborts_engine_request(server: Server) -> None:
    s0 = wait_idle(server)
    disconnects = server.stats()["client_disconnects"]
    payload = {"model": DENSE, "messages": [{"role": "user", "content": "go on forever"}], "stream": True, **LONG}
    with open_request(server, payload) as sock:
        received = b""
        while received.count(b"data: ") < 6:
            chunk = sock.recv(65536)
            assert chunk, "server closed the stream early"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
    s1 = wait_idle(server)
    generated = s1["stats"]["generation_tokens"] - s0["stats"]["generation_tokens"]
    assert 0 < generated < MAX_TOKENS // 2
    assert server.stats()["client_disconnects"] == disconnects + 1


def test_non_streaming_disconnect_aborts_engine_request(server: Server) -> None:
    s0 = wait_idle(server)
    disconnects = server.stats()["client_disconnects"]
    payload = {"model": DENSE, "messages": [{"role": "user", "content": "go on forever"}], **LONG}
    with open_request(server, payload):
        # Hang up once the engine has the request (the frontend counts it as soon
        # as it is added; generated-token stats may lag on a loaded machine).
        deadline = time.monotonic() + 60
        while engine(server)["stats"]["unfinished"] == 0:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.05)
        time.sleep(0.2)
    s1 = wait_idle(server)
    generated = s1["stats"]["generation_tokens"] - s0["stats"]["generation_tokens"]
    assert generated < MAX_TOKENS // 2  # it reached the engine (above) and stopped early
    assert server.stats()["client_disconnects"] == disconnects + 1


def test_no_preemptions(server: Server) -> None:
    assert engine(server)["stats"]["preemptions"] == 0
