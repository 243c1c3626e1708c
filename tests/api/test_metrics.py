"""GET /metrics against a load of known shape: every counter matches what the clients saw.

A real server on the replay engine (no vLLM): one model with 2 running slots and 2 queue
places, paced at 30 ms a token, so long streams hold the slots while the test looks. No
sleep synchronizes anything: the test waits for state it can observe (on /metrics itself).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.recordings import tag
from gateway.app import create_app
from gateway.settings import Settings, hash_key
from tests.conftest import API_KEY, DENSE, MODELS, MOE, ROOT, Fleet, Launch, Server, free_port, open_post, wanted

MODEL = "replay"
ALICE, BOB = "sk-metrics-alice", "sk-metrics-bob"  # bob: 1 request per minute
OTHERS = [f"sk-metrics-u{i}" for i in range(3)]  # users 3..5: beyond max_users (3)
LONG = [{"role": "user", "content": f"Go on. {tag('long')}"}]
SHORT = [{"role": "user", "content": "What is the capital of France?"}]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def config(tmp: Path, port: int) -> Path:
    keys = [
        {"name": "alice", "sha256": hash_key(ALICE)},
        {"name": "bob", "sha256": hash_key(BOB), "rpm": 1},
        *({"name": f"u{i}", "sha256": hash_key(k)} for i, k in enumerate(OTHERS)),
    ]
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": keys},
        "models": [
            {
                "name": MODEL,
                "engine": "replay",
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": 4096,
                "max_num_seqs": 2,
                "replay": {"token_delay_s": 0.03},
            }
        ],
        # The counts below follow plain round-robin admission: with fair share a user who just
        # finished (bob) is owed a slot for idle_s, so alice's second stream would queue.
        # Fair share has its own tests (tests/api/test_fair_share.py).
        "admission": {"max_queued": 2, "fair_share": {"enabled": False}},
        "metrics": {"max_users": 3},
    }
    path = tmp / "metrics.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# A server per test: each test checks absolute counts, and which users get their own label
# depends on who came first. Started together up front.
def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """A server for each test that uses `gw`, started with the session's others (`fleet`)."""
    launches = []
    for i in range(wanted(request, "gw", __name__)):
        port = free_port()
        (tmp / str(i)).mkdir()
        launches.append(Launch(config(tmp / str(i), port), tmp / str(i) / "server.log", port))
    return launches


@pytest.fixture(scope="module")
def servers(fleet: Fleet) -> Iterator[Iterator[Server]]:
    with fleet.servers(__name__) as pool:
        yield iter(pool)


@pytest.fixture
def gw(servers: Iterator[Server]) -> Server:
    return next(servers)


def scrape(server: Server) -> Samples:
    r = httpx.get(f"{server.base_url}/metrics", timeout=30)
    r.raise_for_status()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(server: Server, ok: Callable[[Samples], bool], timeout_s: float = 60) -> Samples:
    """Scrape until `ok` holds (observable state, not a guessed delay)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await asyncio.to_thread(scrape, server)
        if ok(samples):
            return samples
        assert time.monotonic() < deadline, "the state never came"
        await asyncio.sleep(0.05)


def chat(key: str, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra, "_key": key}


async def post(client: httpx.AsyncClient, body: dict[str, object], **headers: str) -> httpx.Response:
    key = body.pop("_key")
    return await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers})


def running(model: str = MODEL) -> Callable[[Samples], float]:
    return lambda s: value(s, "sparkgate_running_requests", model=model)


async def test_counters_match_what_the_clients_saw(gw: Server) -> None:
    server = gw
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        # Quota: bob's first request runs, his second in the minute is a 429 (rpm).
        first = await post(client, chat(BOB, SHORT, 2))
        assert first.status_code == 200
        refused = await post(client, chat(BOB, SHORT, 2))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"

        # Two long streams take both slots: one read to the end, one whose client leaves.
        kept_req = chat(ALICE, LONG, 120, stream=True, stream_options={"include_usage": True})
        kept_req.pop("_key")
        kept_ctx = client.stream(
            "POST", "/v1/chat/completions", json=kept_req, headers={"Authorization": f"Bearer {ALICE}"}
        )
        kept = await kept_ctx.__aenter__()
        kept_lines = kept.aiter_lines()
        assert (await kept_lines.__anext__()).startswith("data: ")
        leaving = open_post(server, "/v1/chat/completions", {**chat(ALICE, LONG, 120, stream=True)}, key=ALICE)
        assert b"200 OK" in leaving.recv(4096)  # its headers: admitted and streaming
        await until(server, lambda s: running()(s) == 2)

        # Two more wait in the queue (2 places); the next one is turned away (queue_full).
        queued = [asyncio.ensure_future(post(client, chat(ALICE, SHORT, 4))) for _ in range(2)]
        await until(server, lambda s: value(s, "sparkgate_queued_requests", model=MODEL) == 2)
        full = await post(client, chat(ALICE, SHORT, 4))
        assert full.status_code == 503 and full.json()["error"]["code"] == "server_overloaded"

        # The leaving client hangs up mid-stream: its slot goes to a queued request.
        leaving.shutdown(socket.SHUT_RDWR)
        leaving.close()
        await until(server, lambda s: value(s, "sparkgate_requests_total", model=MODEL, outcome="client_left") == 1)
        done = await asyncio.gather(*queued)
        assert [r.status_code for r in done] == [200, 200]
        usage: dict[str, int] = {}
        async for line in kept_lines:
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                usage = event.get("usage") or usage
        await kept_ctx.__aexit__(None, None, None)
        assert usage["completion_tokens"] == 120

    s = await until(server, lambda s: running()(s) == 0 and value(s, "sparkgate_inflight_requests", model=MODEL) == 0)
    completed = [first.json()["usage"], usage, *(r.json()["usage"] for r in done)]
    outcomes = {
        "completed": 4,
        "client_left": 1,
        "rejected_quota": 1,
        "rejected_admission": 1,
        "failed": 0,
        "client_left_queued": 0,
    }
    for outcome, n in outcomes.items():
        assert value(s, "sparkgate_requests_total", model=MODEL, outcome=outcome) == n, outcome
    assert value(s, "sparkgate_admitted_total", model=MODEL) == 5
    assert value(s, "sparkgate_queued_total", model=MODEL) == 2
    assert value(s, "sparkgate_admission_rejected_total", model=MODEL, reason="queue_full") == 1
    assert value(s, "sparkgate_quota_rejected_total", reason="rpm") == 1
    assert value(s, "sparkgate_quota_reserved_total") == 6  # everything but bob's 429
    # Histograms: one queue wait per admission, a first token for each request that ran, the
    # rest for completed requests, with the token counts the clients were given.
    assert value(s, "sparkgate_queue_wait_seconds_count", model=MODEL) == 5
    assert value(s, "sparkgate_ttft_seconds_count", model=MODEL) == 5
    assert value(s, "sparkgate_e2e_seconds_count", model=MODEL) == 4
    assert value(s, "sparkgate_output_tokens_count", model=MODEL) == 4
    assert value(s, "sparkgate_output_tokens_sum", model=MODEL) == sum(u["completion_tokens"] for u in completed)
    assert value(s, "sparkgate_prompt_tokens_sum", model=MODEL) == sum(u["prompt_tokens"] for u in completed)
    # Two of the queued waited; TTFT and end to end cover at least the long stream's 120 tokens.
    assert value(s, "sparkgate_queue_wait_seconds_sum", model=MODEL) > 0
    assert value(s, "sparkgate_e2e_seconds_sum", model=MODEL) >= 119 * 0.03
    # Usage per user: every request that reached the engine, the one whose client left too.
    assert value(s, "sparkgate_user_requests_total", user="alice") == 4
    assert value(s, "sparkgate_user_requests_total", user="bob") == 1
    alice_out = value(s, "sparkgate_user_tokens_total", user="alice", type="completion")
    assert alice_out > sum(u["completion_tokens"] for u in completed[1:])  # plus what the leaver got
    assert value(s, "sparkgate_team_requests_total", team="none") == 5
    # Live state is back to idle; the pool is the replay engine's; nothing was preempted.
    assert value(s, "sparkgate_kv_pool_blocks", model=MODEL) == 4096
    for gauge in ("kv_reserved_blocks", "kv_engine_used_blocks", "queued_requests", "queued_tokens"):
        assert value(s, f"sparkgate_{gauge}", model=MODEL) == 0, gauge
    assert value(s, "sparkgate_engine_preemptions_total", model=MODEL) == 0
    assert value(s, "sparkgate_engine_up", model=MODEL) == 1


async def test_label_sets_stay_bounded(gw: Server) -> None:
    server = gw
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        # Users beyond metrics.max_users (3) are counted as `other`.
        for key in [ALICE, *OTHERS]:
            assert (await post(client, chat(key, SHORT, 1))).status_code == 200
        users = {dict(labels)["user"] for (name, labels) in scrape(server) if name == "sparkgate_user_requests_total"}
        assert len(users) <= 4 and "other" in users and "alice" in users

        # 1000 requests with distinct request ids and user agents add no series.
        before = scrape(server)
        sem = asyncio.Semaphore(4)  # 2 running + 2 queued: nobody is turned away

        async def one(i: int) -> int:
            async with sem:
                headers = {"User-Agent": f"agent-{i}", "X-Request-Id": f"req-{i}"}
                r = await post(client, chat(ALICE, SHORT, 1), **headers)
                return r.status_code

        codes = await asyncio.gather(*(one(i) for i in range(1000)))
        assert set(codes) == {200}
    after = await until(server, lambda s: running()(s) == 0)
    assert set(after) == set(before)
    assert value(after, "sparkgate_requests_total", model=MODEL, outcome="completed") == (
        value(before, "sparkgate_requests_total", model=MODEL, outcome="completed") + 1000
    )


def settings(**metrics: object) -> Settings:
    return Settings(
        auth={"required": False},
        models=[{"name": MODEL, "engine": "replay", "path": str(MODELS / "tiny-qwen3")}],
        metrics=metrics,
    )


def test_access_loopback_token_and_disabled() -> None:
    loopback, remote = ("127.0.0.1", 40000), ("192.0.2.7", 40000)
    with TestClient(create_app(settings()), client=loopback) as c:
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "sparkgate_kv_pool_blocks" in r.text
    with TestClient(create_app(settings()), client=remote) as c:
        assert c.get("/metrics").status_code == 403
    with TestClient(create_app(settings(token="s3cret")), client=remote) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    with TestClient(create_app(settings(enabled=False)), client=loopback) as c:
        assert c.get("/metrics").status_code == 404
        ok = c.post("/v1/chat/completions", json={"model": MODEL, "messages": SHORT, "max_tokens": 2})
        assert ok.status_code == 200  # nothing measured, everything served


@pytest.mark.engine
def test_vllm_engines_own_metrics_for_each_model(server: Server) -> None:
    """The session's two in-process vLLM engines: each one's `vllm:*` metrics, labelled `model`
    (vLLM itself keeps only the last engine's in the global registry)."""
    r = httpx.post(
        f"{server.api}/chat/completions",
        json={"model": MOE, "messages": SHORT, "max_tokens": 4},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200
    s = scrape(server)
    for model in (DENSE, MOE):
        assert ("vllm:num_requests_running", frozenset({("model", model), ("engine", "0")})) in s, model
        assert value(s, "sparkgate_kv_pool_blocks", model=model) > 0
    assert not any(dict(labels).get("model_name") for _, labels in s)
    assert value(s, "vllm:generation_tokens_total", model=MOE, engine="0") >= 4
