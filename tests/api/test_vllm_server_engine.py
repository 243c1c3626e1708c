"""A stock vLLM OpenAI server as the engine (`engine: vllm-server`): the CPU build's
`python -m vllm.entrypoints.openai.api_server` with a tiny model, a `sparkgate serve` in front
of it claiming half of its pool, and the real openai SDK as the client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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

from tests import exit_with_parent
from tests.conftest import MODELS, ROOT, STARTUP_TIMEOUT_S, Server, free_port, launch

pytestmark = pytest.mark.engine  # starts a vLLM engine

KEY = "sk-vllm-server-test"
MODEL = "tiny-served"
SHARE = 0.5
MAX_NUM_SEQS = 4
# 40 blocks of 128 tokens at the tiny model's 512 bytes a token: one 4,096-token sequence fits
# the pool (vLLM refuses less), but not this gateway's half of it (19 blocks).
KV_BYTES = 40 * 128 * 512
# A system prompt longer than two of the CPU build's 128-token blocks: a repeat hits the cache.
SYSTEM = "You answer questions about boxes, crates, cartons and other containers. " * 30
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say something about boxes."}]


class VllmServer:
    """vLLM's own OpenAI server on a fixed port, started again in place by `restart` (after a
    test killed it), so the module's later tests find one whatever the order."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp, self.port, self.starts = tmp, port, 0
        self.proc = self._start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        log_path = self.tmp / f"vllm-{self.starts}.log"
        # It ends with this process, killed or not (tests/exit_with_parent.py): it and, as its
        # group's leader, its engine core.
        argv = exit_with_parent.command(
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODELS / "tiny-qwen3"),
            "--served-model-name",
            MODEL,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--kv-cache-memory-bytes",
            str(KV_BYTES),
            "--enforce-eager",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",  # cached tokens in the usage
            # JSON without free whitespace, as the gateway's own engines (json_whitespace:
            # compact): an engine setting, which a request cannot ask for.
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-uvicorn-access-log",
        )
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": "0",
            "VLLM_RPC_BASE_PATH": str(self.tmp),
            "VLLM_CACHE_ROOT": str(ROOT / ".cache" / "vllm"),
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return proc
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM's server did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def restart(self) -> None:
        self.proc = self._start()

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.base_url}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    def pool_blocks(self) -> int:
        text = httpx.get(f"{self.base_url}/metrics", timeout=5).text
        line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
        return int(line.split('num_gpu_blocks="', 1)[1].split('"', 1)[0])


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(tmp_path_factory.mktemp("vllm-server"), free_port())
    try:
        yield server
    finally:
        server.kill()


def gateway_config(tmp: Path, port: int, address: str, tokenizer: Path) -> Path:
    from gateway.settings import hash_key

    cfg: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "tester", "sha256": hash_key(KEY)}]},
        "models": [
            {
                "name": MODEL,
                "engine": "vllm-server",
                "path": str(tokenizer),  # only its tokenizer is read here
                "max_model_len": 4096,
                "max_num_seqs": MAX_NUM_SEQS,
                "vllm_server": {"address": address, "share": SHARE, "poll_interval_s": 0.2},
            }
        ],
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def gateway(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vllm-server-gateway")
    port = free_port()
    config = gateway_config(tmp, port, vllm.base_url, MODELS / "tiny-qwen3")
    with launch(config, tmp / "gateway.log", port) as server:
        yield server


def client(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api, api_key=KEY, max_retries=0, timeout=60)


def stats(gateway: Server) -> dict[str, Any]:
    r = httpx.get(f"{gateway.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def wait_ready(gateway: Server, status: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while httpx.get(f"{gateway.base_url}/ready", timeout=5).status_code != status:
        assert time.monotonic() < deadline, f"/ready never answered {status}"
        time.sleep(0.2)


def test_chat_is_generated_by_the_vllm_server(gateway: Server, vllm: VllmServer) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)  # a test before may have restarted it
    before = vllm.metric("vllm:generation_tokens_total")
    done = client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, extra_body={"ignore_eos": True}
    )  # type: ignore[call-overload]
    assert done.usage is not None and done.usage.completion_tokens == 6
    assert done.choices[0].finish_reason == "length" and done.choices[0].message.content
    assert vllm.metric("vllm:generation_tokens_total") - before == 6  # the server made them


def test_streaming_and_cached_tokens_come_back(gateway: Server) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)
    client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)  # fills the cache
    stream = client(gateway).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=5,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # type: ignore[call-overload]
    texts = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
        usage = chunk.usage or usage
    assert all(texts.values())
    assert usage is not None and usage.completion_tokens == 10
    assert usage.prompt_tokens > 256 and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= 256  # whole 128-token blocks of the system prompt


def test_structured_output_and_logprobs_cross_the_wire(gateway: Server) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    r = client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a colour."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}},
    )
    assert json.loads(r.choices[0].message.content or "")["colour"] in {"red", "green", "blue"}
    done = client(gateway).completions.create(model=MODEL, prompt=[9707, 11, 1879], max_tokens=4, logprobs=2)
    lp = done.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    # As vLLM answers: the sampled token first, then the top 2 (3 entries when it is not among them).
    assert lp.top_logprobs is not None and len(lp.top_logprobs) == 4
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert top is not None and next(iter(top)) == token and len(top) in (2, 3)


def test_admission_counts_against_the_share_of_the_servers_pool(gateway: Server, vllm: VllmServer) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)
    engine = stats(gateway)["engines"][MODEL]
    pool = vllm.pool_blocks()  # num_gpu_blocks, its null block included
    assert engine["kv"]["num_blocks"] == int((pool - 1) * SHARE) + 1
    assert engine["kv"]["block_size"] == 128 and engine["kv"]["max_num_seqs"] == int(MAX_NUM_SEQS * SHARE)
    assert engine["admission"]["capacity_blocks"] == int((pool - 1) * SHARE)
    # A request that needs more blocks than the share holds (~3,100 tokens: 25 blocks, of 19)
    # fits the server's whole pool and its context, but is refused before the server sees it.
    before = vllm.metric("vllm:prompt_tokens_total")
    with pytest.raises(openai.BadRequestError):
        client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "box " * 3000}], max_tokens=100
        )
    assert vllm.metric("vllm:prompt_tokens_total") == before


def test_a_client_that_hangs_up_aborts_the_request_on_the_server(gateway: Server, vllm: VllmServer) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)
    stream = client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
    )  # type: ignore[call-overload]
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    assert vllm.metric("vllm:num_requests_running") >= 1
    stream.close()
    deadline = time.monotonic() + 20
    while vllm.metric("vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert vllm.metric("vllm:num_requests_running") == 0
    assert vllm.metric("vllm:generation_tokens_total") < 1500  # stopped, not run to the end
    assert stats(gateway)["engines"][MODEL]["admission"]["used_blocks"] == 0


def other_tokenizer(tmp: Path) -> Path:
    """The tiny model's tokenizer with two ids swapped: it loads, and disagrees with the server's."""
    out = tmp / "other-tokenizer"
    out.mkdir()
    for f in (MODELS / "tiny-qwen3").iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["Hello"], vocab["Ġworld"] = vocab["Ġworld"], vocab["Hello"]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return out


def test_a_different_tokenizer_is_refused_before_serving(vllm: VllmServer, tmp_path: Path) -> None:
    config = gateway_config(tmp_path, free_port(), vllm.base_url, other_tokenizer(tmp_path))
    proc = subprocess.run(
        # Meant to exit at once; should it serve instead, it still ends with this process.
        exit_with_parent.command("gateway.cli", "serve", "--config", str(config)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
    )
    assert proc.returncode != 0
    assert "tokenizer differs" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


def test_the_server_killed_and_restarted(gateway: Server, vllm: VllmServer) -> None:
    wait_ready(gateway, 200, seconds=STARTUP_TIMEOUT_S)
    vllm.kill()
    wait_ready(gateway, 503)
    with pytest.raises(openai.APIStatusError) as err:
        client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert err.value.status_code == 503
    vllm.restart()
    wait_ready(gateway, 200, seconds=60)
    done = client(gateway).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens >= 1
