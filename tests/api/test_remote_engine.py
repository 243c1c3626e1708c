"""A gateway whose model runs on another box: `sparkgate engine-host` serves a real tiny
vLLM CPU engine, and a `sparkgate serve` reaches it as `engine: remote`, with the real
openai SDK as the client. The gateway claims half of the engine; admission counts
against that half."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import MODELS, ROOT, Server, free_port, launch

pytestmark = pytest.mark.engine  # starts vLLM engines

TOKEN = "engine-host-test-token"
KEY = "sk-remote-test"
MODEL = "tiny-remote"
SIM = "sim-27b"  # a simulated engine on the host, in real time
SHARE = 0.5
MESSAGES = [{"role": "user", "content": "Say something about boxes."}]


def write(path: str, cfg: dict) -> str:  # type: ignore[type-arg]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


class Host:
    """The engine host: `sparkgate engine-host` on a fixed port, started again in place by
    `restart` (after a test killed it), so the module's later tests find one whatever the
    order."""

    def __init__(self, stack: contextlib.ExitStack, config: Path, port: int) -> None:
        self.stack, self.config, self.port = stack, config, port
        self.starts = 0
        self.server = self._launch()

    def _launch(self) -> Server:
        self.starts += 1
        log = self.config.parent / f"host-{self.starts}.log"
        env = {"SPARKGATE_ENGINE_TOKEN": TOKEN}
        return self.stack.enter_context(launch(self.config, log, self.port, "engine-host", "/engine/v1/health", env))

    def restart(self) -> None:
        """Start it again on the same config and port (the old one must be gone)."""
        self.server = self._launch()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.server.proc


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    tmp = tmp_path_factory.mktemp("engine-host")
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "cache_dir": str(ROOT / ".cache")},
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": 4096,
                "max_num_seqs": 4,
                "kv_cache_bytes": "32MiB",
                "cpu_cores": "0",
            },
            # The DGX Spark box model in real time: a long prompt keeps the stream quiet for
            # seconds, as a real long prefill does.
            {
                "name": SIM,
                "engine": "simulated",
                "path": str(MODELS / "tiny-qwen3"),
                "simulated": {"model": "Qwen3.8-27B", "speedup": 1.0},
                "max_model_len": 65536,
                "kv_cache_bytes": "4GiB",
            },
        ],
    }
    write(str(tmp / "host.yaml"), cfg)
    with contextlib.ExitStack() as stack:
        yield Host(stack, tmp / "host.yaml", port)


@pytest.fixture(scope="module")
def gateway(host: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from gateway.settings import hash_key

    tmp = tmp_path_factory.mktemp("remote-gateway")
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "tester", "sha256": hash_key(KEY)}]},
        "routing": {"enabled": True, "classes": {"interactive": {"ttft_s": 30.0}}, "default_class": "interactive"},
        "models": [
            {
                "name": MODEL,
                "engine": "remote",
                "path": str(MODELS / "tiny-qwen3"),  # only its tokenizer is read here
                "remote": {"address": host.base_url, "share": SHARE, "poll_interval_s": 0.2, "read_timeout_s": 4},
            },
            {
                "name": SIM,
                "engine": "remote",
                "path": str(MODELS / "tiny-qwen3"),
                "remote": {"address": host.base_url, "read_timeout_s": 4},
            },
        ],
    }
    write(str(tmp / "gateway.yaml"), cfg)
    with launch(tmp / "gateway.yaml", tmp / "gateway.log", port, env={"SPARKGATE_ENGINE_TOKEN": TOKEN}) as server:
        yield server


def host_call(host: Host, method: str, path: str, gateway: str, token: str = TOKEN, **kw: object) -> httpx.Response:
    """A call to the engine host as gateway `gateway`."""
    headers = {"Authorization": f"Bearer {token}", "X-Sparkgate-Gateway": gateway}
    return httpx.request(method, f"{host.base_url}/engine/v1{path}", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


def observe(host: Host) -> dict:  # type: ignore[type-arg]
    """The host engine's stats, through a small claim of its own (the stats call renews it)."""
    r = host_call(host, "GET", f"/{MODEL}/stats", "observer")
    if r.status_code == 409:
        claim = host_call(host, "POST", f"/{MODEL}/claim", "observer", json={"share": 0.25})
        assert claim.status_code == 200, claim.text
        r = host_call(host, "GET", f"/{MODEL}/stats", "observer")
    assert r.status_code == 200, r.text
    return r.json()["stats"]  # type: ignore[no-any-return]


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY, max_retries=0)


def stats(server: Server) -> dict:  # type: ignore[type-arg]
    r = httpx.get(f"{server.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_chat_is_served_by_the_engine_on_the_other_box(gateway: Server, host: Host) -> None:
    before = observe(host)["generation_tokens"]
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="auto",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    done = raw.parse()
    assert raw.headers["x-sparkgate-model"] == MODEL
    assert done.usage is not None and done.usage.completion_tokens == 12
    assert done.choices[0].finish_reason == "length" and done.choices[0].message.content
    deadline = time.monotonic() + 10  # the host's stat logger runs once per engine step
    while observe(host)["generation_tokens"] - before < 12 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert observe(host)["generation_tokens"] - before >= 12


def test_streaming_and_the_prefix_cache_cross_the_wire(gateway: Server) -> None:
    long = [{"role": "user", "content": "Boxes and their contents. " * 40}]
    for _ in range(2):
        chunks = list(
            client(gateway).chat.completions.create(
                model=MODEL,
                messages=long,  # type: ignore[arg-type]
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    details = usage.prompt_tokens_details
    # The second request found the first one's whole blocks in the remote engine's prefix cache.
    block = stats(gateway)["engines"][MODEL]["kv"]["block_size"]
    whole_blocks = (usage.prompt_tokens - 1) // block * block  # vLLM recomputes at least the last token
    assert details is not None and details.cached_tokens == whole_blocks > 0


def test_admission_counts_against_the_claimed_share(gateway: Server, host: Host) -> None:
    info = host_call(host, "POST", f"/{MODEL}/claim", "probe", json={"share": 0.25})
    assert info.status_code == 200, info.text
    pool = info.json()["pool_blocks"]
    kv = stats(gateway)["engines"][MODEL]["kv"]
    assert kv["num_blocks"] - 1 == int(pool * SHARE)  # what admission hands out: half the pool
    assert stats(gateway)["engines"][MODEL]["admission"]["capacity_blocks"] == int(pool * SHARE)
    assert kv["max_num_seqs"] == 2  # half of the host's 4 slots
    # The gateway's half and the observer's quarter leave a quarter: more is refused.
    # (observe() may hold its quarter; release it so the arithmetic is this test's.)
    host_call(host, "DELETE", f"/{MODEL}/claim", "observer")
    over = host_call(host, "POST", f"/{MODEL}/claim", "greedy", json={"share": 0.3})
    assert over.status_code == 409
    assert over.json()["error"]["code"] == "engine_share_unavailable"
    assert "hold 0.75" in over.json()["error"]["message"]
    assert host_call(host, "DELETE", f"/{MODEL}/claim", "probe").status_code == 200
    assert host_call(host, "POST", f"/{MODEL}/claim", "greedy", json={"share": 0.3}).status_code == 200
    host_call(host, "DELETE", f"/{MODEL}/claim", "greedy")


def test_the_host_wants_its_token(host: Host) -> None:
    r = host_call(host, "POST", f"/{MODEL}/claim", "x", token="wrong", json={"share": 0.1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = host_call(host, "POST", "/no-such-model/claim", "x", json={"share": 0.1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # A generate without a live claim is refused: it would not be counted by anyone.
    frame = {
        "request": {
            "request_id": "r1",
            "prompt_token_ids": [1, 2, 3],
            "sampling": {"max_tokens": 2},
        }
    }
    r = host_call(host, "POST", f"/{MODEL}/generate", "nobody", json=frame)
    assert r.status_code == 409


def long_stream(gateway: Server) -> openai.Stream[Any]:
    """A streamed answer that runs for minutes unless it is cut."""
    return client(gateway).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=3000,
        stream=True,
        extra_body={"ignore_eos": True},
    )


def test_a_client_that_hangs_up_frees_the_remote_engine(gateway: Server, host: Host) -> None:
    stream = long_stream(gateway)
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    assert observe(host)["running"] >= 1 or observe(host)["unfinished"] >= 1
    stream.close()
    deadline = time.monotonic() + 20
    while observe(host)["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.2)
    after = observe(host)
    assert after["unfinished"] == 0, after
    assert stats(gateway)["engines"][MODEL]["admission"]["used_blocks"] == 0


def test_a_long_prefill_is_not_a_stall(gateway: Server) -> None:
    """A first token that takes longer than the gateway's 4 s read timeout: the host's
    heartbeat keeps the quiet stream alive."""
    prompt = "Boxes, crates and cartons of every size. " * 2500  # ~22K tokens: ~8 s on the 27B
    t0 = time.monotonic()
    done = client(gateway).chat.completions.create(
        model=SIM,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2,
    )
    waited = time.monotonic() - t0
    assert done.usage is not None and done.usage.completion_tokens == 2 and done.usage.prompt_tokens > 20_000
    assert waited > 5, waited  # longer than the read timeout: only the heartbeat kept it open


def test_a_stalled_host_is_cut_off_and_comes_back(gateway: Server, host: Host) -> None:
    stream = long_stream(gateway)
    os.kill(host.proc.pid, signal.SIGSTOP)  # the host freezes: no bytes, no close
    try:
        t0 = time.monotonic()
        with pytest.raises(openai.APIError) as err:
            for _ in stream:
                pass
        cut_after = time.monotonic() - t0
        assert "failed mid-request" in str(err.value.message) or "engine" in str(err.value.message)
        assert cut_after < 15, cut_after  # the 4 s read timeout, not a hang
        assert httpx.get(f"{gateway.base_url}/ready", timeout=60).status_code == 503
    finally:
        os.kill(host.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while httpx.get(f"{gateway.base_url}/ready", timeout=60).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    done = client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert done.usage is not None and done.usage.completion_tokens >= 1
    # The cut request was aborted on the host once it woke up: nothing left running there.
    deadline = time.monotonic() + 20
    while observe(host)["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert observe(host)["unfinished"] == 0
    assert stats(gateway)["engines"][MODEL]["admission"]["used_blocks"] == 0


def _state(gateway: Server, model: str) -> str:
    state: str = httpx.get(f"{gateway.base_url}/ready", timeout=60).json()["models"][model]["state"]
    return state


def test_a_dead_host_gives_a_clear_503_and_a_restarted_one_is_claimed_again(gateway: Server, host: Host) -> None:
    host.proc.kill()  # started again below, for the tests that come after
    host.proc.wait()
    # Each model on the host is watched on its own: wait for this one's state, not for the
    # first 503 (the host's other model may be noticed first).
    deadline = time.monotonic() + 10
    while _state(gateway, MODEL) == "up" and time.monotonic() < deadline:
        time.sleep(0.2)
    health = httpx.get(f"{gateway.base_url}/ready", timeout=60)
    assert health.status_code == 503 and health.json()["models"][MODEL]["state"] in ("unreachable", "unavailable")
    with pytest.raises(openai.APIStatusError) as e:
        client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert e.value.status_code == 503
    assert e.value.body["code"] == "engine_unavailable"  # type: ignore[index]
    assert e.value.response.headers["retry-after"] == "5"
    # The gateway itself stays up and says why.
    assert "tiny-remote" in e.value.message

    # The host comes back (same config and port): the gateway's poll claims its share again.
    host.restart()
    deadline = time.monotonic() + 10
    while httpx.get(f"{gateway.base_url}/ready", timeout=60).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    done = client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert done.usage is not None and done.usage.completion_tokens >= 1
