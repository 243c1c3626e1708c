"""gateway/http/body_limits.py: the body checks, and the middleware in front of a small app
with the gateway's own error handlers (in process, through httpx's ASGI transport)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from gateway import errors
from gateway.http import errors as http_errors
from gateway.http.body_limits import BodyLimitsMiddleware, check_body, json_depth_exceeds

MAX_BYTES = 4096
MAX_DEPTH = 8


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"{}", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 1),  # brackets in strings do not count
        (b'{"a": "\\"[[[[[[[[[[[[[[[[[[["}', 1),  # nor after an escaped quote
        (b"[" + b"[]," * 1000 + b"[]]", 2),  # wide is not deep
        (nested(8), 8),
        (b'[{"x": [{"y": [[[1]]]}]}]', 7),
    ],
)
def test_depth(body: bytes, depth: int) -> None:
    assert json_depth_exceeds(body, depth) is False
    assert json_depth_exceeds(body, depth - 1) is True


def test_very_deep_bodies_are_caught_without_recursion() -> None:
    assert json_depth_exceeds(nested(200_000), 64)
    with pytest.raises(errors.MalformedBody) as e:
        check_body(nested(200_000), 64)
    assert e.value.code == "json_too_deep"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"a": "\xff"}', "invalid_encoding"),
        (b'{"a": "\xc3"}', "invalid_encoding"),  # a cut multi-byte character
        (b"[[[[[[[[[[]]]]]]]]]]", "json_too_deep"),
    ],
)
def test_bad_bodies(body: bytes, code: str) -> None:
    with pytest.raises(errors.MalformedBody) as e:
        check_body(body, MAX_DEPTH)
    assert (e.value.status, e.value.code) == (400, code)


def test_good_body_passes() -> None:
    check_body(json.dumps({"model": "m", "messages": [{"role": "user", "content": "héllo ✓"}]}).encode(), MAX_DEPTH)


# --- the middleware, in front of an app -------------------------------------------------


@pytest.fixture
def app() -> FastAPI:
    app = FastAPI()
    http_errors.install(app)
    app.add_middleware(BodyLimitsMiddleware, max_body_bytes=MAX_BYTES, max_json_depth=MAX_DEPTH)
    app.state.seen = []

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, Any]:
        body = await request.body()
        request.app.state.seen.append(body)
        return {"content_type": request.headers.get("content-type"), "json": json.loads(body) if body else None}

    @app.post("/other")
    async def other(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def post(app: FastAPI, content: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    async with client(app) as c:
        return await c.post("/v1/echo", content=content, headers=headers or {})


def assert_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {
        "error": {"message": r.json()["error"]["message"], "type": "invalid_request_error", "param": None, "code": code}
    }


async def test_json_passes_through_unchanged(app: FastAPI) -> None:
    body = json.dumps({"a": [1, 2, "ü"]}).encode()
    for ctype in (None, "application/json", "application/json; charset=utf-8", "application/x-www-form-urlencoded"):
        r = await post(app, body, {"content-type": ctype} if ctype else {})
        assert r.status_code == 200 and r.json() == {"content_type": "application/json", "json": {"a": [1, 2, "ü"]}}
    assert app.state.seen == [body] * 4


async def test_too_large_by_content_length(app: FastAPI) -> None:
    r = await post(app, b"{" + b" " * MAX_BYTES + b"}")
    assert_error(r, 413, "request_too_large")
    assert app.state.seen == []


async def test_too_large_when_chunked(app: FastAPI) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"a": "'
        for _ in range(MAX_BYTES // 100 + 1):
            yield b"x" * 100
        yield b'"}'

    r = await post(app, chunks())
    assert_error(r, 413, "request_too_large")
    assert app.state.seen == []


async def test_chunked_within_the_limit_is_read_whole(app: FastAPI) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"a": '
        yield b"[1, 2]}"

    r = await post(app, chunks())
    assert r.status_code == 200 and r.json()["json"] == {"a": [1, 2]}


@pytest.mark.parametrize(
    ("content", "ctype", "code"),
    [
        (b'{"a": "\xff"}', "application/json", "invalid_encoding"),
        (nested(MAX_DEPTH + 1), "application/json", "json_too_deep"),
        (b'{"a": 1}', "text/plain", "unsupported_content_type"),
        (b"a=1&b=2", "multipart/form-data; boundary=x", "unsupported_content_type"),
        (b"<a/>", "application/xml", "unsupported_content_type"),
    ],
)
async def test_bad_bodies_never_reach_the_route(app: FastAPI, content: bytes, ctype: str, code: str) -> None:
    assert_error(await post(app, content, {"content-type": ctype}), 400, code)
    assert app.state.seen == []


async def test_other_paths_and_empty_bodies_are_left_alone(app: FastAPI) -> None:
    async with client(app) as c:
        r = await c.post("/other", content=b"\xff" * (MAX_BYTES + 1), headers={"content-type": "text/plain"})
        assert r.json() == {"bytes": MAX_BYTES + 1}
        r = await c.post("/v1/echo", headers={"content-type": "text/plain"})
        assert r.status_code == 200 and r.json()["json"] is None


def test_limit_settings_are_validated() -> None:
    from pydantic import ValidationError

    from gateway.settings import LimitSettings

    limits = LimitSettings(max_body_bytes="1MiB")
    assert limits.max_body_bytes == 1024 * 1024 and limits.max_json_depth == 64 and limits.max_stop == 4
    for bad in ({"max_body_bytes": "lots"}, {"max_json_depth": 0}, {"max_n": 0}, {"max_stop": 0}, {"unknown": 1}):
        with pytest.raises(ValidationError):
            LimitSettings(**bad)
