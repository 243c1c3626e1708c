"""SIGTERM drains a real `sparkgate serve` process (gateway/drain.py).

A simulated engine slowed by configuration (its box runs at a fraction of real time), so a
stream is surely in flight when the test signals: the long stream below would take minutes,
and the test ends it itself. Quotas in a real redis-server, with leases far longer than the
test, so a hold released only by lease expiry would show as a leak.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, ROOT, Fleet, Launch, RedisServer, Server, free_port, wanted

KEY = "sk-drain"
MODEL = "sim"
PREFIX = "drain:"
# Qwen3.6-35B-A3B decodes a token in ~6 ms on the box; at this speed-up about 0.1 s of wall
# time: a short stream (SHORT tokens) lasts a few seconds, a long one (LONG) many minutes.
SPEEDUP = 0.06
SHORT = 12
LONG = 5000
EXIT_TIMEOUT_S = 60
MESSAGES = [{"role": "user", "content": "Tell me about draining."}]
AUTH = {"Authorization": f"Bearer {KEY}"}


def _config(tmp: Path, port: int, redis_url: str, grace_s: float, max_num_seqs: int) -> Path:
    cfg = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "info",
            "cache_dir": str(ROOT / ".cache"),
            "drain_grace_s": grace_s,
        },
        "auth": {"required": True, "keys": [{"name": "drainer", "sha256": hash_key(KEY)}]},
        "quotas": {"store": "redis", "redis_url": redis_url, "key_prefix": PREFIX, "lease_s": 600},
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "tiny-qwen3"),  # the tokenizer
                "engine": "simulated",
                "simulated": {"model": "Qwen3.6-35B-A3B", "speedup": SPEEDUP},
                "max_model_len": 8192,
                "max_num_seqs": max_num_seqs,
                "kv_cache_bytes": "4GiB",
            }
        ],
    }
    path = tmp / "drain.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


HOST_TOKEN = "drain-host-token"


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """A gateway and an engine host, for the tests that use them, started with the session's
    others (tests/conftest.py: `fleet`); each test drains its own to the end."""
    launches = []
    if wanted(request, "drained_gateway", __name__, at_least=0):
        (tmp / "gateway").mkdir()
        port = free_port()
        redis_url = request.getfixturevalue("redis_server").url
        config = _config(tmp / "gateway", port, redis_url, grace_s=300, max_num_seqs=4)
        launches.append(Launch(config, tmp / "gateway" / "server.log", port))
    if wanted(request, "drained_host", __name__, at_least=0):
        (tmp / "host").mkdir()
        port = free_port()
        cfg = yaml.safe_load(_config(tmp / "host", port, "redis://unused", grace_s=300, max_num_seqs=4).read_text())
        del cfg["auth"], cfg["quotas"]
        (tmp / "host" / "host.yaml").write_text(yaml.safe_dump(cfg))
        env = {"SPARKGATE_ENGINE_TOKEN": HOST_TOKEN}
        launches.append(
            Launch(tmp / "host" / "host.yaml", tmp / "host" / "host.log", port, "engine-host", "/engine/v1/health", env)
        )
    return launches


@pytest.fixture(scope="module")
def drained(fleet: Fleet) -> Iterator[dict[str, Server]]:
    with fleet.servers(__name__) as servers:
        yield {"host" if s.config is not None and s.config.name == "host.yaml" else "gateway": s for s in servers}


@pytest.fixture
def drained_gateway(drained: dict[str, Server], redis_server: RedisServer) -> Server:
    r = redis.Redis.from_url(redis_server.url)
    for key in r.scan_iter(f"{PREFIX}*"):  # the counters from zero (the Redis is the session's)
        r.delete(key)
    return drained["gateway"]


@pytest.fixture
def drained_host(drained: dict[str, Server]) -> Server:
    return drained["host"]


def _client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api, api_key=KEY, max_retries=0, timeout=120)


class Stream:
    """One streaming chat read with the openai SDK: its chunks, then how it ended."""

    def __init__(self, server: Server, max_tokens: int) -> None:
        self.first = asyncio.Event()
        self.text = ""
        self.usage: Any = None
        self.finish: str | None = None
        self.error: openai.APIError | None = None
        self.task = asyncio.ensure_future(self._read(server, max_tokens))

    async def _read(self, server: Server, max_tokens: int) -> None:
        try:
            stream = await _client(server).chat.completions.create(
                model=MODEL,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
                    self.finish = chunk.choices[0].finish_reason or self.finish
                    if self.text:
                        self.first.set()
                if chunk.usage is not None:
                    self.usage = chunk.usage
        except openai.APIError as e:  # the in-band error event
            self.error = e
        finally:
            self.first.set()


async def _started(streams: list[Stream]) -> None:
    await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 120)
    for s in streams:
        assert s.error is None and s.text, s.error


async def _exited(server: Server) -> int:
    code = await asyncio.to_thread(server.proc.wait, EXIT_TIMEOUT_S)
    return int(code)


def _redis_after(redis_srv: RedisServer) -> tuple[dict[str, int], int, int]:
    """What Redis holds once the gateway is gone: the user's day counters, live holds, leases."""
    r = redis.Redis.from_url(redis_srv.url, decode_responses=True)
    day = r.time()[0] // 86400
    counters = {k: int(v) for k, v in r.hgetall(f"{PREFIX}d:user:drainer:{day}").items()}
    live = sum(int(r.scard(k)) for k in r.scan_iter(f"{PREFIX}live:*"))
    return counters, live, int(r.zcard(f"{PREFIX}leases"))


def _assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_shutting_down"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["connection"] == "close"


def test_sigterm_drains_then_a_second_one_aborts(drained_gateway: Server, redis_server: RedisServer) -> None:
    """Four slots: three short streams and a long one run, a fifth request queues. SIGTERM:
    the queued request and a new one get 503 at once, /ready 503, /health still 200; the
    short streams run to their end; the long one keeps the drain open until a second SIGTERM
    cuts it with an in-band error. Exit 0; what ran is charged, no quota hold is left.
    (The end of the grace aborts the same way: tests/unit/test_drain.py.)"""

    async def scenario(server: Server) -> tuple[list[Stream], Stream, httpx.Response, int]:
        short = [Stream(server, SHORT) for _ in range(3)]
        long = Stream(server, LONG)
        await _started([*short, long])
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60, headers=AUTH) as http:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
            queued = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
            deadline = time.monotonic() + 60
            while (await http.get("/sparkgate/stats")).json()["engines"][MODEL]["admission"]["queued"] < 1:
                assert time.monotonic() < deadline and not queued.done(), "the fifth request did not queue"
                await asyncio.sleep(0.05)
            os.kill(server.proc.pid, signal.SIGTERM)
            refused = await queued  # at once, though the grace is long
            ready = await http.get("/ready")
            assert ready.status_code == 503 and "draining" in ready.json()["reasons"], ready.text
            assert (await http.get("/health")).status_code == 200  # alive: nothing to restart
            _assert_refused(await http.post("/v1/chat/completions", json=body))
        await asyncio.gather(*(s.task for s in short))
        assert server.proc.poll() is None and not long.task.done()  # the long stream keeps the drain open...
        os.kill(server.proc.pid, signal.SIGTERM)  # ...until the second SIGTERM
        await long.task
        return short, long, refused, await _exited(server)

    short, long, refused, code = asyncio.run(scenario(drained_gateway))
    assert code == 0
    _assert_refused(refused)
    for s in short:  # whole, with their usage
        assert s.error is None and s.finish == "length", (s.error, s.finish)
        assert s.usage is not None and s.usage.completion_tokens == SHORT
    assert long.error is not None and isinstance(long.error.body, dict), long.error
    assert long.error.body["code"] == "server_shutting_down"
    assert long.finish is None and long.text  # cut after some output
    counters, live, leases = _redis_after(redis_server)
    assert counters.get("reserved", 0) == 0 and live == 0 and leases == 0, (counters, live, leases)
    assert counters["requests"] == 4  # the refused ones were never charged
    returned = sum(s.usage.total_tokens for s in short)
    charged = counters["prompt"] + counters["completion"]
    long_prompt = short[0].usage.prompt_tokens  # the same messages
    # The short streams' usage exactly, plus the long one's prompt and the tokens it produced.
    assert charged - returned - long_prompt == counters["completion"] - SHORT * len(short) > 0, counters


def test_an_engine_host_drains_too(drained_host: Server) -> None:
    """`sparkgate engine-host` on SIGTERM: new generate calls get 503, stats tell the
    gateways the engine takes no new work, a running stream finishes, a long one is aborted
    by the second SIGTERM (the engine's "abort" ends it); exit 0."""
    from engine_adapter.base import EngineRequest, SamplingOptions
    from engine_adapter.wire import GenerateFrame, StreamFrame

    headers = {
        "Authorization": f"Bearer {HOST_TOKEN}",
        "X-Sparkgate-Gateway": "gw-1",
        "Content-Type": "application/json",
    }

    def frame(rid: str, max_tokens: int) -> str:
        request = EngineRequest(
            request_id=rid, prompt_token_ids=(1, 2, 3), sampling=SamplingOptions(max_tokens=max_tokens)
        )
        return GenerateFrame(request=request).model_dump_json()

    async def generate(http: httpx.AsyncClient, rid: str, max_tokens: int, first: asyncio.Event) -> list[StreamFrame]:
        frames = []
        async with http.stream("POST", f"/engine/v1/{MODEL}/generate", content=frame(rid, max_tokens)) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.strip():
                    frames.append(StreamFrame.model_validate_json(line))
                    first.set()
        return frames

    async def scenario(host: Server) -> tuple[list[StreamFrame], list[StreamFrame], int]:
        async with httpx.AsyncClient(base_url=host.base_url, headers=headers, timeout=120) as http:
            claim = await http.post(f"/engine/v1/{MODEL}/claim", json={"share": 1.0})
            assert claim.status_code == 200 and claim.json()["healthy"], claim.text
            began = [asyncio.Event(), asyncio.Event()]
            short = asyncio.ensure_future(generate(http, "short", SHORT, began[0]))
            long = asyncio.ensure_future(generate(http, "long", LONG, began[1]))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in began)), 120)
            os.kill(host.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while (stats := await http.get(f"/engine/v1/{MODEL}/stats")).json()["healthy"]:
                assert time.monotonic() < deadline, "the host still says healthy after SIGTERM"
                await asyncio.sleep(0.05)
            assert stats.status_code == 200
            refused = await http.post(f"/engine/v1/{MODEL}/generate", content=frame("new", 4))
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
            short_frames = await short
            assert host.proc.poll() is None and not long.done()  # the long stream keeps the drain open...
            os.kill(host.proc.pid, signal.SIGTERM)  # ...until the second SIGTERM
            long_frames = await long
        return short_frames, long_frames, await _exited(host)

    short, long, code = asyncio.run(scenario(drained_host))
    assert code == 0
    last = short[-1].chunk
    assert last is not None and last.choices[0].finish_reason == "length"
    assert sum(len(f.chunk.choices[0].token_ids) for f in short if f.chunk is not None) == SHORT
    end = long[-1].chunk
    assert end is not None and end.choices[0].finish_reason == "abort"
