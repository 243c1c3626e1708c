"""Security on a real gateway (one simulated engine, no vLLM), through the real openai SDK:
brute-force throttling per client address, the admin guard on every admin route, CORS,
request ids and errors that carry no secrets, a log without keys, and per-user prefix
caches.

Each test speaks from its own loopback source address (127.0.0.N: the gateway sees each as a
client of its own), so the failure counts of one test never reach another. The gateway
trusts X-Forwarded-For from 127.0.0.2 only.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.settings import Settings, hash_key, load_settings
from tests.conftest import MODELS, ROOT, Fleet, Launch, Server, config_launch, free_port

RUN = uuid.uuid4().hex[:10]
ALICE = f"sk-sec-alice-{RUN}"
BOB = f"sk-sec-bob-{RUN}"
ADMIN = f"sk-sec-admin-{RUN}"
GUESS = f"sk-sec-guess-{RUN}"  # no such key
MODEL = "sim"
ORIGIN = "https://chat.example.com"
MAX_FAILURES = 4
BLOCK_S = 6.0  # short, so a test can see a block end; generous beside one request's time
MESSAGES = [{"role": "user", "content": "Hello there."}]
PROXY = "127.0.0.2"  # server.trusted_proxies (not 127.0.0.1, which uvicorn would trust by default)
_addresses = (f"127.0.0.{i}" for i in itertools.count(10))


def fresh_address() -> str:
    """A loopback source address no other test uses: a client of its own."""
    return next(_addresses)


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    cfg = {
        "server": {
            "host": "127.0.0.1",
            "port": free_port(),
            "log_level": "debug",  # the most talkative: the key check below reads every line
            "access_log": True,  # uvicorn's lines too: a key in a URL must be redacted there
            "cache_dir": str(ROOT / ".cache"),
            "trusted_proxies": [PROXY],
            "cors": {"allow_origins": [ORIGIN]},
        },
        "auth": {
            "required": True,
            "keys": [{"name": "alice", "sha256": hash_key(ALICE)}, {"name": "bob", "sha256": hash_key(BOB)}],
            "admin_keys": [{"name": "root", "sha256": hash_key(ADMIN)}],
            "failed": {"max_failures": MAX_FAILURES, "window_s": 600, "block_s": BLOCK_S},
        },
        "models": [
            {
                "name": MODEL,
                "engine": "simulated",
                "path": str(MODELS / "tiny-qwen3"),
                "simulated": {"model": "Qwen3.8-27B", "speedup": 100.0},
                "max_model_len": 8192,
                "max_num_seqs": 4,
                "kv_cache_bytes": "1GiB",
                "prefix": {"cache_isolation": "user"},
            }
        ],
    }
    return [config_launch(cfg, tmp)]


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (server,):
        yield server


@pytest.fixture(scope="module")
def config(gw: Server) -> Path:
    assert gw.config is not None
    return gw.config


def http(gw: Server, source: str) -> httpx.Client:
    return httpx.Client(base_url=gw.base_url, transport=httpx.HTTPTransport(local_address=source), timeout=60)


def sdk(gw: Server, key: str, source: str, **headers: str) -> openai.OpenAI:
    transport = httpx2.HTTPTransport(local_address=source)  # the SDK's own httpx
    return openai.OpenAI(
        base_url=gw.api,
        api_key=key,
        max_retries=0,
        timeout=60,
        default_headers=headers,
        http_client=openai.DefaultHttpxClient(transport=transport),
    )


def auth_failures(gw: Server) -> dict[str, float]:
    r = httpx.get(f"{gw.base_url}/metrics", timeout=30)  # from loopback: no token needed
    r.raise_for_status()
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
        if s.name == "sparkgate_auth_failures_total"
    }


def block(client: openai.OpenAI) -> None:
    """Fail MAX_FAILURES times with a wrong key: the client's address is then blocked."""
    for _ in range(MAX_FAILURES):
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_brute_force_gets_429_and_no_one_else_does(gw: Server) -> None:
    attacker, neighbour = fresh_address(), fresh_address()
    before = auth_failures(gw)
    guesser = sdk(gw, GUESS, attacker)
    block(guesser)
    with pytest.raises(openai.RateLimitError) as e:
        guesser.models.list()
    assert e.value.code == "too_many_failed_authentications"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= BLOCK_S
    assert GUESS not in e.value.response.text
    # Blocked means blocked: the right key from that address is not even looked at.
    with pytest.raises(openai.RateLimitError):
        sdk(gw, ALICE, attacker).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    # Another address is served, and its own count starts at zero.
    done = sdk(gw, ALICE, neighbour).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert done.choices[0].finish_reason == "length"
    with pytest.raises(openai.AuthenticationError):
        sdk(gw, GUESS, neighbour).models.list()
    assert http(gw, neighbour).get("/v1/models").status_code == 401  # no key: counted, guesses nothing
    after = auth_failures(gw)
    assert after["invalid"] - before.get("invalid", 0) == MAX_FAILURES + 1
    assert after["blocked"] - before.get("blocked", 0) == 2
    assert after["missing"] - before.get("missing", 0) == 1


def test_a_block_ends_after_block_s(gw: Server) -> None:
    address = fresh_address()
    block(sdk(gw, GUESS, address))
    blocked_at = time.monotonic()
    client = http(gw, address)
    headers = {"Authorization": f"Bearer {ALICE}"}
    first = client.get("/v1/models", headers=headers)
    assert first.status_code == 429
    deadline = blocked_at + BLOCK_S + 60  # generous: a loaded machine
    while (r := client.get("/v1/models", headers=headers)).status_code == 429:
        assert time.monotonic() < deadline, "the block never ended"
        time.sleep(0.2)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
    assert time.monotonic() - blocked_at >= BLOCK_S - 1  # not before the block's end (Retry-After rounds up)


def test_x_forwarded_for_counts_only_from_a_trusted_proxy(gw: Server) -> None:
    # Through the proxy: the client it names is blocked, the proxy's other clients are not.
    # A forged entry on the left changes nothing: the address the proxy itself added counts.
    block(sdk(gw, GUESS, PROXY, **{"X-Forwarded-For": "203.0.113.1, 198.51.100.7"}))
    with pytest.raises(openai.RateLimitError):
        sdk(gw, ALICE, PROXY, **{"X-Forwarded-For": "198.51.100.7"}).models.list()
    assert sdk(gw, ALICE, PROXY, **{"X-Forwarded-For": "198.51.100.8"}).models.list().data
    assert sdk(gw, ALICE, PROXY).models.list().data  # the proxy itself is not blocked
    # From anyone else, X-Forwarded-For is ignored: the peer is the client. 127.0.0.1 too,
    # which uvicorn would trust unless told otherwise (gateway/cli.py tells it).
    untrusted = "127.0.0.1"
    block(sdk(gw, GUESS, untrusted, **{"X-Forwarded-For": "198.51.100.9"}))
    with pytest.raises(openai.RateLimitError):
        sdk(gw, ALICE, untrusted, **{"X-Forwarded-For": "198.51.100.10"}).models.list()


def admin_routes(config: Path) -> list[tuple[str, str]]:
    """Every method and path under /sparkgate/admin in the app as built (path parameters filled in)."""
    app = create_app(load_settings(config))
    found = []
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path.startswith("/sparkgate/admin"):
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            found += [(m, path) for m in sorted(route.methods)]
    return found


def test_every_admin_route_needs_the_admin_key(gw: Server, config: Path) -> None:
    routes = admin_routes(config)
    assert {("POST", "/sparkgate/admin/keys"), ("GET", "/sparkgate/admin/usage")} <= set(routes)
    client = http(gw, fresh_address())
    for method, path in [*routes, ("GET", "/sparkgate/admin/no/such/route"), ("GET", "/sparkgate/dashboard/data")]:
        user = client.request(method, path, headers={"Authorization": f"Bearer {ALICE}"})
        assert user.status_code == 403, (method, path, user.status_code)
        nobody = client.request(method, path)
        assert nobody.status_code == 401, (method, path)
        if method != "HEAD":  # a HEAD answer has no body
            assert user.json()["error"]["code"] == "permission_denied"
            assert nobody.json()["error"]["code"] == "missing_api_key"
        admin = client.request(method, path, headers={"Authorization": f"Bearer {ADMIN}"})
        assert admin.status_code not in (401, 403), (method, path)
    assert client.get("/sparkgate/admin/keys", headers={"Authorization": f"Bearer {GUESS}"}).status_code == 401
    listed = client.get("/sparkgate/admin/keys", headers={"Authorization": f"Bearer {ADMIN}"})
    assert listed.status_code == 200 and {k["name"] for k in listed.json()["data"]} == {"alice", "bob"}


def test_cors_preflight_for_a_configured_origin(gw: Server) -> None:
    client = http(gw, fresh_address())
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models"):
        pre = client.options(
            path,
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert pre.status_code == 200, (path, pre.text)
        assert pre.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    other = client.options(
        "/v1/chat/completions", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # A real request from the page: the SDK's answer carries the headers a browser needs.
    raw = sdk(gw, ALICE, fresh_address(), Origin=ORIGIN).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=2,
    )
    assert raw.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in raw.headers["access-control-expose-headers"].lower()


def test_cors_is_off_by_default() -> None:
    settings = Settings(models=[{"name": MODEL, "engine": "replay", "path": str(MODELS / "tiny-qwen3")}])
    assert settings.server.cors.allow_origins == ()
    client = TestClient(create_app(settings))  # no lifespan: the answers below need no engine
    pre = client.options("/v1/chat/completions", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405
    assert not any(h.startswith("access-control-") for h in pre.headers)


def test_client_request_ids_are_sanitized(gw: Server) -> None:
    client = http(gw, fresh_address())
    headers = {"Authorization": f"Bearer {ALICE}"}
    ok = f"run-{RUN}:1/a+b=c@d.e_f"
    assert client.get("/v1/models", headers=headers | {"X-Request-Id": ok}).headers["x-request-id"] == ok
    for bad in ("two words", "x" * 129, "a\tb", "id status=200 user=root", f"sk-proj-{RUN}abcdef", '"}{'):
        r = client.get("/v1/models", headers=headers | {"X-Request-Id": bad})
        assert r.status_code == 200
        assert r.headers["x-request-id"].startswith("req-"), bad  # the gateway's own instead


def test_errors_never_echo_a_key(gw: Server) -> None:
    address = fresh_address()
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(gw, GUESS, address).models.list()
    assert GUESS not in e.value.response.text
    secret_model = f"sk-proj-{RUN}model"
    with pytest.raises(openai.NotFoundError) as nf:
        sdk(gw, ALICE, address).chat.completions.create(model=secret_model, messages=MESSAGES)  # type: ignore[arg-type]
    assert secret_model not in nf.value.response.text and "[redacted]" in nf.value.message


def test_no_key_in_the_log(gw: Server) -> None:
    """Runs whatever ran before: traffic of every kind that carries a key, then the log."""
    address = fresh_address()
    sdk(gw, ALICE, address).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.AuthenticationError):
        sdk(gw, GUESS, address).models.list()
    client = http(gw, address)
    client.get(f"/v1/models?api_key={ALICE}")  # a key in a URL: the access log's line
    client.get("/v1/models", headers={"Authorization": f"Bearer {ALICE}", "X-Request-Id": ALICE})
    client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"}, json={"model": BOB, "messages": []}
    )
    client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"}, json={"model": MODEL, "messages": BOB}
    )
    client.get("/sparkgate/admin/keys", headers={"Authorization": f"Bearer {ADMIN}"})
    # The request log line is written when the response has ended: wait for the last one's.
    deadline = time.monotonic() + 30
    while "/sparkgate/admin/keys" not in (text := gw.log_path.read_text(errors="replace")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert " DEBUG " in text  # the check ran at the most talkative level
    for secret in (ALICE, BOB, ADMIN, GUESS):
        assert secret not in text, f"{secret!r} is in the gateway's log"
    assert "/v1/models?api_key=[redacted]" in text  # the access log line is there, redacted


def test_each_user_has_a_prefix_cache_of_their_own(gw: Server) -> None:
    """cache_isolation: user. Bob's identical prompt finds none of Alice's cached blocks:
    no one can learn from timing (or cached_tokens) what someone else asked."""
    address = fresh_address()
    prompt = [{"role": "user", "content": f"{RUN} " + "A long shared document about boxes. " * 60}]

    def cached(key: str) -> int:
        done = sdk(gw, key, address).chat.completions.create(model=MODEL, messages=prompt, max_tokens=2)  # type: ignore[arg-type]
        assert done.usage is not None and done.usage.prompt_tokens > 256
        details = done.usage.prompt_tokens_details
        return 0 if details is None else details.cached_tokens or 0

    assert cached(ALICE) == 0
    assert cached(ALICE) >= 256  # her second request reuses her first's blocks
    assert cached(BOB) == 0  # the same prompt, another user: nothing shared
    assert cached(BOB) >= 256
