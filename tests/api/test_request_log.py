"""The request log: one JSON line per request (logger `sparkgate.request`), on a gateway with
the replay engine, `log_format: json` and `log_level: debug`; /health and /ready.

Every line of the server's output is JSON, and none of them, at any level, holds an API key
or the prompt's text (a unique marker in every prompt, unique keys)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engine_adapter.recordings import RECORDINGS, tag
from tests.conftest import MODELS, ROOT, Fleet, Launch, Server, config_launch, free_port

RUN = uuid.uuid4().hex[:12]
KEY = f"sk-logtest-{RUN}-main"
TINY_KEY = f"sk-logtest-{RUN}-tiny"  # rpm 1: its second request is refused
WRONG_KEY = f"sk-logtest-{RUN}-wrong"  # no such key: 401
MARKER = f"zebra-marker-{RUN}"  # in every prompt: must never reach the log
MODEL = "replay"
SLOW = "replay-slow"  # tokens come slowly: a client can leave mid-stream
ONE = "replay-one"  # one running request; the gateway queues one (admission.max_queued: 1)
FIELDS = {
    "request_id",
    "method",
    "path",
    "status",
    "error_code",
    "key_id",
    "user",
    "team",
    "model",
    "served_model",
    "slo_class",
    "stream",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "admission",
    "queue_wait_ms",
    "ttft_ms",
    "total_ms",
    "finish_reason",
    "outcome",
}


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    from gateway.settings import hash_key

    port = free_port()
    path = str(MODELS / "tiny-qwen3")
    cfg = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "debug",
            "log_format": "json",
            "access_log": True,  # uvicorn's lines must keep keys out too
            "cache_dir": str(ROOT / ".cache"),
        },
        "auth": {
            "required": True,
            "keys": [
                {"name": "main", "user": "alice", "team": "lab", "sha256": hash_key(KEY)},
                {"name": "tiny", "user": "bob", "sha256": hash_key(TINY_KEY), "rpm": 1},
            ],
        },
        "quotas": {"store": "memory", "teams": [{"name": "lab"}]},
        "models": [
            {"name": MODEL, "engine": "replay", "path": path, "max_model_len": 4096},
            {"name": SLOW, "engine": "replay", "path": path, "max_model_len": 4096, "replay": {"token_delay_s": 0.05}},
            {
                "name": ONE,
                "engine": "replay",
                "path": path,
                "max_model_len": 4096,
                "max_num_seqs": 1,
                "replay": {"token_delay_s": 0.05},
            },
        ],
        "admission": {"max_queued": 1},
    }
    return [config_launch(cfg, tmp)]


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (server,):
        yield server


def messages(text: str = "What is the capital of France?") -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{text} {MARKER}"}]


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


def lines(server: Server) -> list[str]:
    return server.log_path.read_text(errors="replace").splitlines()


def request_line(server: Server, request_id: str, timeout_s: float = 10) -> dict[str, Any]:
    """The request's log record (written when its response has ended: maybe just after)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for line in lines(server):
            if request_id not in line:
                continue
            rec = json.loads(line)
            if rec.get("logger") == "sparkgate.request" and rec.get("request_id") == request_id:
                found.append(rec)
        if found:
            assert len(found) == 1, found  # one line per request
            rec = found[0]
            assert rec.keys() >= FIELDS, FIELDS - rec.keys()
            assert rec["level"] == "INFO" and rec["msg"] == "request"
            return rec
        if time.monotonic() > deadline:
            pytest.fail(f"no request log line for {request_id}")
        time.sleep(0.1)


def post(server: Server, path: str, body: Any, *, key: str = KEY, request_id: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    return httpx.post(f"{server.base_url}{path}", json=body, headers=headers, timeout=60)


def test_health_is_liveness_and_ready_tells_the_engines(gateway: Server) -> None:
    r = httpx.get(f"{gateway.base_url}/health", timeout=60)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = httpx.get(f"{gateway.base_url}/ready", timeout=60)
    assert r.status_code == 200, r.text
    up = {"state": "up", "deaths": 0, "restarts": 0}
    assert r.json() == {"status": "ok", "ready": True, "models": {MODEL: up, SLOW: up, ONE: up}}
    # Probes are not request-logged (they come every few seconds).
    assert not any('"path": "/ready"' in line or '"path": "/health"' in line for line in lines(gateway))


def test_a_plain_chat_logs_one_line_with_its_usage(gateway: Server) -> None:
    given = rid()
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()}, request_id=given)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == given  # the client's id is echoed
    assert r.json()["choices"][0]["message"]["content"] == RECORDINGS["answer"]
    usage = r.json()["usage"]
    rec = request_line(gateway, given)
    assert rec["method"] == "POST" and rec["path"] == "/v1/chat/completions"
    assert rec["status"] == 200 and rec["error_code"] is None and rec["outcome"] == "ok"
    assert (rec["key_id"], rec["user"], rec["team"]) == ("cfg-main", "alice", "lab")
    assert rec["model"] == MODEL and rec["served_model"] == MODEL and rec["stream"] is False
    assert rec["prompt_tokens"] == usage["prompt_tokens"]
    assert rec["output_tokens"] == usage["completion_tokens"]
    assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert rec["reasoning_tokens"] == 0
    assert rec["finish_reason"] == "stop"
    assert rec["admission"] in ("admitted", "queued") and rec["queue_wait_ms"] >= 0
    assert 0 < rec["ttft_ms"] <= rec["total_ms"]


def test_without_a_client_id_the_job_id_is_the_request_id(gateway: Server) -> None:
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == r.json()["id"]
    assert request_line(gateway, r.json()["id"])["status"] == 200
    # An unusable id (too long, or not printable) is replaced, not echoed.
    too_long = "x" * 129
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()}, request_id=too_long)
    assert r.status_code == 200 and r.headers["x-request-id"] == r.json()["id"]


def test_a_streamed_chat_is_logged_when_the_stream_ends(gateway: Server) -> None:
    given = rid()
    client = openai.OpenAI(base_url=gateway.api, api_key=KEY, max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages(f"Go on. {tag('think')}"),  # type: ignore[arg-type]
        max_tokens=400,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Request-Id": given},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    rec = request_line(gateway, given)
    assert rec["status"] == 200 and rec["stream"] is True and rec["outcome"] == "ok"
    assert rec["output_tokens"] == usage.completion_tokens
    assert usage.completion_tokens_details is not None
    assert rec["reasoning_tokens"] == usage.completion_tokens_details.reasoning_tokens > 0
    assert rec["finish_reason"] == "stop"
    assert 0 < rec["ttft_ms"] <= rec["total_ms"]


def test_a_responses_api_request_is_logged(gateway: Server) -> None:
    given = rid()
    r = post(gateway, "/v1/responses", {"model": MODEL, "input": f"Hello {MARKER}", "stream": True}, request_id=given)
    assert r.status_code == 200 and r.headers["x-request-id"] == given
    rec = request_line(gateway, given)
    assert rec["path"] == "/v1/responses" and rec["model"] == MODEL and rec["outcome"] == "ok"
    assert rec["output_tokens"] > 0 and rec["finish_reason"] == "stop"


def test_a_400_is_logged_with_its_code(gateway: Server) -> None:
    given = rid()
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages(), "n": 99}, request_id=given)
    assert r.status_code == 400 and r.headers["x-request-id"] == given
    rec = request_line(gateway, given)
    assert rec["status"] == 400 and rec["error_code"] == "invalid_value" and rec["outcome"] == "error"
    assert rec["user"] == "alice" and rec["model"] == MODEL and rec["served_model"] is None
    # A body that does not validate: no model known, still one line.
    given = rid()
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": MARKER}, request_id=given)
    assert r.status_code == 400
    rec = request_line(gateway, given)
    assert rec["status"] == 400 and rec["error_code"] == "invalid_type"  # a string where messages go


def test_a_401_is_logged_without_the_key(gateway: Server) -> None:
    given = rid()
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()}, key=WRONG_KEY, request_id=given)
    assert r.status_code == 401 and r.headers["x-request-id"] == given
    rec = request_line(gateway, given)
    assert rec["status"] == 401 and rec["error_code"] == "invalid_api_key"
    assert rec["key_id"] is None and rec["user"] is None
    # Without a client id, an error still gets one, in the header and the log.
    r = post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()}, key=WRONG_KEY)
    assert r.status_code == 401 and r.headers["x-request-id"].startswith("req-")
    assert request_line(gateway, r.headers["x-request-id"])["status"] == 401


def test_a_quota_429_is_logged_as_a_rejection(gateway: Server) -> None:
    first, second = rid(), rid()
    body = {"model": MODEL, "messages": messages(), "max_tokens": 8}
    assert post(gateway, "/v1/chat/completions", body, key=TINY_KEY, request_id=first).status_code == 200
    r = post(gateway, "/v1/chat/completions", body, key=TINY_KEY, request_id=second)
    assert r.status_code == 429, r.text
    rec = request_line(gateway, second)
    assert rec["status"] == 429 and rec["error_code"] == "rate_limit_exceeded"
    assert rec["admission"] == "rejected:quota_rpm" and rec["queue_wait_ms"] is None
    assert (rec["key_id"], rec["user"]) == ("cfg-tiny", "bob")
    assert rec["served_model"] == MODEL and rec["output_tokens"] == 0


def open_stream(server: Server, model: str, request_id: str) -> socket.socket:
    """A long stream over a raw socket, read until it runs: the test decides when it hangs up."""
    body = json.dumps(
        {"model": model, "messages": messages(f"Go on. {tag('long')}"), "max_tokens": 2000, "stream": True}
    ).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nX-Request-Id: {request_id}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    got = b""
    while got.count(b"data:") < 3:  # the stream runs
        got += sock.recv(4096)
    assert f"x-request-id: {request_id}".encode() in got.lower()
    return sock


def test_a_client_that_leaves_mid_stream_is_logged(gateway: Server) -> None:
    given = rid()
    with open_stream(gateway, SLOW, given):
        pass  # and hang up
    rec = request_line(gateway, given)
    assert rec["status"] == 200 and rec["outcome"] == "client_left" and rec["finish_reason"] is None
    assert 0 < rec["output_tokens"] < 2000


def queued_so_far(server: Server) -> int:
    return int(server.stats(KEY)["admission"]["queued"])


def test_a_queued_request_and_an_admission_503_are_logged(gateway: Server) -> None:
    running, waiting, refused = rid(), rid(), rid()
    body = {"model": ONE, "messages": messages(), "max_tokens": 4}
    with ThreadPoolExecutor(1) as pool, open_stream(gateway, ONE, running):  # holds the model's one slot
        before = queued_so_far(gateway)
        queued = pool.submit(post, gateway, "/v1/chat/completions", body, request_id=waiting)
        deadline = time.monotonic() + 10
        while queued_so_far(gateway) == before:  # the queue's one place is taken
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.05)
        r = post(gateway, "/v1/chat/completions", body, request_id=refused)
        assert r.status_code == 503, r.text
        time.sleep(0.2)
    assert queued.result().status_code == 200  # admitted once the stream's client left
    rec = request_line(gateway, refused)
    assert rec["status"] == 503 and rec["error_code"] == "server_overloaded"
    assert rec["admission"] == "rejected:queue_full" and rec["served_model"] == ONE
    rec = request_line(gateway, waiting)
    assert rec["status"] == 200 and rec["admission"] == "queued" and rec["queue_wait_ms"] >= 150
    assert rec["ttft_ms"] > rec["queue_wait_ms"]
    assert request_line(gateway, running)["outcome"] == "client_left"


def test_no_key_or_prompt_text_in_any_log_line(gateway: Server) -> None:
    # Runs last in a module (random order aside, it checks whatever ran before it): make
    # sure there is traffic of every kind first.
    post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()})
    post(gateway, "/v1/completions", {"model": MODEL, "prompt": f"Say {MARKER}", "max_tokens": 4})
    post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": messages()}, key=WRONG_KEY)
    post(gateway, "/v1/chat/completions", {"model": MODEL, "messages": MARKER})
    time.sleep(0.5)
    text = gateway.log_path.read_text(errors="replace")
    assert '"level": "DEBUG"' in text  # the check ran at the most talkative level
    for secret in (KEY, TINY_KEY, WRONG_KEY, MARKER, RUN):
        assert secret not in text, f"{secret!r} is in the server log"
    for line in text.splitlines():
        json.loads(line)  # every line, every logger's: JSON
    assert '"logger": "uvicorn.access"' in text  # uvicorn's own lines too


def test_a_text_log_format_is_the_default() -> None:
    from gateway.settings import ServerSettings

    assert ServerSettings().log_format == "text"
