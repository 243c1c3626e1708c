"""gateway/http/body_limits.py: compressed request bodies (Content-Encoding zstd, gzip,
deflate) decoded within limits.max_body_bytes, in front of a small app with the gateway's own
error handlers (in process, through httpx's ASGI transport)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from typing import Any

import httpx
import pytest
import zstandard
from fastapi import FastAPI, Request

from gateway import errors
from gateway.http import errors as http_errors
from gateway.http.body_limits import BodyLimitsMiddleware, decode_body

MAX_BYTES = 64 * 1024
BODY = json.dumps({"model": "m", "input": [{"role": "user", "content": "héllo " * 2000}]}).encode()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def make_app(max_body_bytes: int = MAX_BYTES) -> FastAPI:
    app = FastAPI()
    http_errors.install(app)
    app.add_middleware(BodyLimitsMiddleware, max_body_bytes=max_body_bytes, max_json_depth=16)
    app.state.seen = []

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, Any]:
        body = await request.body()
        request.app.state.seen.append(body)
        headers = request.headers
        return {
            "encoding": headers.get("content-encoding"),
            "length": headers.get("content-length"),
            "bytes": len(body),
        }

    return app


@pytest.fixture
def app() -> FastAPI:
    return make_app()


async def post(app: FastAPI, content: bytes, encoding: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"} | ({"content-encoding": encoding} if encoding else {})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        return await c.post("/v1/echo", content=content, headers=headers)


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("zstd", zstd),
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # zlib's format, as HTTP means it
        ("deflate", deflate_raw),  # raw deflate, as some clients send it
        ("GZIP", gzip.compress),
        ("gzip, zstd", lambda b: zstd(gzip.compress(b))),  # applied in order: undone last first
        ("identity", lambda b: b),
    ],
)
async def test_compressed_bodies_reach_the_route_decoded(app: FastAPI, encoding: str, encode: Any) -> None:
    compressed = encode(BODY)
    r = await post(app, compressed, encoding)
    assert r.status_code == 200, r.text
    # The route sees plain JSON: no Content-Encoding left, the decoded length.
    assert r.json() == {"encoding": None, "length": str(len(BODY)), "bytes": len(BODY)}
    assert app.state.seen == [BODY]


def test_gzip_members_one_after_another() -> None:
    assert decode_body(gzip.compress(b'{"a":') + gzip.compress(b"1}"), "gzip", MAX_BYTES) == b'{"a":1}'
    assert decode_body(zstd(b'{"a":') + zstd(b"1}"), "zstd", MAX_BYTES) == b'{"a":1}'


@pytest.mark.parametrize("encoding", ["zstd", "gzip", "deflate"])
async def test_a_decompression_bomb_is_too_large_and_never_decoded_whole(encoding: str) -> None:
    zeros = b"\0" * (8 * 1024 * 1024)
    if encoding == "zstd":  # 1 GiB of zeros: 128 copies of one tiny frame
        bomb = zstandard.ZstdCompressor(level=19).compress(zeros) * 128
    else:  # 64 MiB of zeros in one stream (deflate's ratio is at most about 1000:1)
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        bomb = b"".join(c.compress(zeros) for _ in range(8)) + c.flush()
    assert len(bomb) < 256 * 1024
    app = make_app(max_body_bytes=len(bomb) + 1)  # the compressed body is within the limit
    tracemalloc.start()
    try:
        r = await post(app, bomb, encoding)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large" and "decoded" in r.json()["error"]["message"]
    assert app.state.seen == []  # the route never ran
    assert peak < 16 * 1024 * 1024  # nowhere near what it decodes to


def test_a_zstd_window_larger_than_the_limit_is_too_large() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(22, window_log=27)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = stream.compress(b"\0" * 1024) + stream.flush()  # no size written: the window stays 128 MiB
    with pytest.raises(errors.RequestTooLarge):
        decode_body(frame, "zstd", MAX_BYTES)


def test_the_decoded_limit_holds_at_every_step() -> None:
    with pytest.raises(errors.RequestTooLarge):
        decode_body(zstd(b"x" * (MAX_BYTES + 1)), "zstd", MAX_BYTES)
    with pytest.raises(errors.RequestTooLarge):
        decode_body(gzip.compress(b"x" * (MAX_BYTES + 1)), "gzip", MAX_BYTES)
    assert decode_body(gzip.compress(b"x" * MAX_BYTES), "gzip", MAX_BYTES) == b"x" * MAX_BYTES


async def test_an_unknown_encoding_is_415(app: FastAPI) -> None:
    r = await post(app, b"\x1b\x00\x00", "br")
    assert r.status_code == 415
    error = r.json()["error"]
    assert error["code"] == "unsupported_content_encoding" and "'br'" in error["message"]
    assert app.state.seen == []


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("zstd", b"not zstd at all"),
        ("zstd", zstd(BODY)[:-7]),  # cut short: the reader would end quietly
        ("zstd", zstd(BODY) + b"trailing"),
        ("gzip", b"not gzip"),
        ("gzip", gzip.compress(BODY)[:-12]),
        ("gzip", gzip.compress(BODY) + b"\x00garbage"),
        ("deflate", b"\x78\x9c garbage"),
    ],
)
async def test_a_corrupt_body_is_400(app: FastAPI, encoding: str, body: bytes) -> None:
    r = await post(app, body, encoding)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_content_encoding" and encoding in r.json()["error"]["message"]
    assert app.state.seen == []
