"""gateway/http/json_body.py: msgspec's speed, json.loads's verdict on every document."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from gateway.http import json_body

DOCUMENTS = [
    b'{"model": "m", "prompt": [1, 2, 3]}',
    b'{"a": 1, "a": 2}',  # the last duplicate wins in both
    b'{"a": 100000000000000000000000000000}',  # beyond 64 bits: still an int
    b'{"a": -9223372036854775809}',
    b'{"a": 18446744073709551616}',
    b'{"a": "\\ud83d\\ude00"}',  # a surrogate pair
    b'{"a": NaN}',  # json.loads reads NaN; the request models then refuse it by name
    b'{"a": -Infinity}',
    b'{"a": 1e400}',  # msgspec refuses, json.loads gives inf
    b'{"a": 1.5e3, "b": 0.1, "c": -0, "d": 1.0}',
    b'  {"a": []}  ',
    b'{"a": "\\u0000"}',
    b'"a string"',
    b"[1, [2, [3]]]",
    b"null",
    b"\xef\xbb\xbf{}",  # a UTF-8 BOM: json.loads skips it
]
INVALID = [b"", b'{"a": 1}x', b'{"a": "\x00"}', b"{", b'{"a": tru}']
# json.loads keeps a lone surrogate, which is no Unicode text: an error quoting it could not be
# encoded (a 500). The gateway refuses it as invalid JSON.
LONE_SURROGATES = [b'{"a": "\\ud800"}', b'{"a": ["x", {"b": "\\udfff!"}]}', b'{"\\ud800": 1}']


@pytest.mark.parametrize("doc", LONE_SURROGATES)
def test_refuses_a_lone_surrogate(doc: bytes) -> None:
    json.loads(doc)  # the standard library accepts it
    with pytest.raises(json.JSONDecodeError, match="lone surrogate"):
        json_body.decode(doc)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and types compared (1 is not 1.0 here)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_decodes_as_json_loads_does(doc: bytes) -> None:
    assert _same(json_body.decode(doc), json.loads(doc))


@pytest.mark.parametrize("doc", INVALID)
def test_refuses_as_json_loads_does(doc: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(doc)
    with pytest.raises(json.JSONDecodeError):  # what FastAPI turns into its json_invalid error
        json_body.decode(doc)


class Body(BaseModel):  # at module level: the route's annotations are resolved by name
    ids: list[int]


def test_a_json_route_parses_its_body_with_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    app = FastAPI()
    app.router.route_class = json_body.JSONRoute

    @app.post("/echo")
    async def echo(body: Body) -> dict[str, int]:
        return {"n": len(body.ids)}

    seen: list[bytes] = []
    real = json_body.decode

    def spy(raw: bytes) -> Any:
        seen.append(raw)
        return real(raw)

    monkeypatch.setattr(json_body, "decode", spy)
    with TestClient(app) as client:
        r = client.post("/echo", content=b'{"ids": [1, 2, 3]}', headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json() == {"n": 3}
        assert seen == [b'{"ids": [1, 2, 3]}']
        bad = client.post("/echo", content=b'{"ids": [1, 2', headers={"content-type": "application/json"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["type"] == "json_invalid"
