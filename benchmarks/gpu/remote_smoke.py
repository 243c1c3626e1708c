"""GPU smoke test of the two-box path: an engine host on CUDA vLLM, a gateway reaching it remotely.

Standalone; installs nothing. A child process serves a tiny dense Qwen3 (dummy weights) with
`gateway.engine_host.create_host_app` (what `sparkgate engine-host` runs); a second child
serves `gateway.app.create_app` with that model as `engine: remote` (half of it claimed);
the official `openai` SDK drives the gateway. Writes `<out>/remote_smoke.json`.

    python3 benchmarks/gpu/remote_smoke.py $OUT

Same staging as gpu_smoke.py. SMOKE_CPU=1 runs it on the CPU build (small KV pool).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.gpu_smoke import DENSE, free_port, prepare_model_dirs  # noqa: E402

API_KEY = "sk-remote-smoke"
TOKEN = "remote-smoke-token"
SHARE = 0.5
START_TIMEOUT_S = 600


def host_settings(model_dir: str, cache_dir: str, port: int) -> dict[str, Any]:
    cpu = os.environ.get("SMOKE_CPU") == "1"
    model: dict[str, Any] = {
        "name": DENSE,
        "path": model_dir,
        "load_format": "dummy",
        "max_model_len": 4096,
        "max_num_seqs": 8,
        "kv_cache_bytes": "64MiB" if cpu else "2GiB",
        "enforce_eager": True,
    }
    if cpu:
        model["cpu_cores"] = "0"
    return {"server": {"host": "127.0.0.1", "port": port, "cache_dir": cache_dir}, "models": [model]}


def gateway_settings(model_dir: str, cache_dir: str, port: int, host_port: int) -> dict[str, Any]:
    from gateway.settings import hash_key

    return {
        "server": {"host": "127.0.0.1", "port": port, "cache_dir": cache_dir},
        "auth": {"required": True, "keys": [{"name": "smoke", "sha256": hash_key(API_KEY)}]},
        "routing": {"enabled": True, "classes": {"interactive": {"ttft_s": 30.0}}},
        "models": [
            {
                "name": DENSE,
                "engine": "remote",
                "path": model_dir,
                "remote": {"address": f"http://127.0.0.1:{host_port}", "share": SHARE, "poll_interval_s": 0.2},
            }
        ],
    }


def serve(kind: str, settings_path: str) -> None:
    """Child: the engine host or the gateway, on uvicorn."""
    data = json.loads(Path(settings_path).read_text())
    from gateway import runtime_env

    runtime_env.configure(data["server"]["cache_dir"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from gateway.settings import Settings

    settings = Settings(**data)
    if kind == "host":
        from gateway.engine_host import create_host_app

        app = create_host_app(settings, TOKEN)
    else:
        from gateway.app import create_app

        app = create_app(settings)
    uvicorn.run(app, host="127.0.0.1", port=data["server"]["port"], log_level="info")


def launch(kind: str, settings: dict[str, Any], work: Path, health: str) -> subprocess.Popen[bytes]:
    import httpx

    path = work / f"{kind}.json"
    path.write_text(json.dumps(settings))
    log = (work / f"{kind}.log").open("wb")
    env = {**os.environ, "SPARKGATE_ENGINE_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--{kind}", str(path)], stdout=log, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{settings['server']['port']}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited:\n{(work / f'{kind}.log').read_text()[-4000:]}")
        try:
            if httpx.get(base + health, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"{kind} did not start:\n{(work / f'{kind}.log').read_text()[-4000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def checks(host: str, gateway: str) -> dict[str, Any]:
    import httpx
    import openai

    out: dict[str, Any] = {}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=API_KEY, max_retries=0)

    def as_gateway(gateway: str) -> dict[str, str]:
        return {**auth, "X-Sparkgate-Gateway": gateway}

    def observe() -> dict[str, Any]:
        r = httpx.get(f"{host}/engine/v1/{DENSE}/stats", headers=as_gateway("observer"), timeout=10)
        if r.status_code == 409:
            httpx.post(
                f"{host}/engine/v1/{DENSE}/claim", json={"share": 0.125}, headers=as_gateway("observer")
            ).raise_for_status()
            r = httpx.get(f"{host}/engine/v1/{DENSE}/stats", headers=as_gateway("observer"))
        r.raise_for_status()
        return r.json()["stats"]  # type: ignore[no-any-return]

    def check(name: str, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            out[name] = {"ok": True, **(fn() or {}), "s": round(time.monotonic() - t0, 3)}
        except Exception as e:
            out[name] = {"ok": False, "error": repr(e), "trace": traceback.format_exc()[-1500:]}

    def chat() -> dict[str, Any]:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=16, extra_body={"ignore_eos": True}
        )
        done = raw.parse()
        assert raw.headers["x-sparkgate-model"] == DENSE and done.usage and done.usage.completion_tokens == 16
        return {"route": raw.headers["x-sparkgate-route"], "usage": done.usage.model_dump()}

    def stream_and_cache() -> dict[str, Any]:
        long = [{"role": "user", "content": "Boxes and their contents. " * 200}]
        for _ in range(2):
            chunks = list(
                client.chat.completions.create(
                    model=DENSE, messages=long, max_tokens=8, stream=True, stream_options={"include_usage": True}
                )
            )
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 8
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
        assert cached and cached > usage.prompt_tokens // 2, cached
        return {"prompt_tokens": usage.prompt_tokens, "cached_tokens": cached}

    def share() -> dict[str, Any]:
        stats = httpx.get(f"{gateway}/sparkgate/stats", headers={"Authorization": f"Bearer {API_KEY}"}).json()
        kv = stats["engines"][DENSE]["kv"]
        probe = httpx.post(f"{host}/engine/v1/{DENSE}/claim", json={"share": 0.125}, headers=as_gateway("probe"))
        probe.raise_for_status()
        pool = probe.json()["pool_blocks"]
        greedy = httpx.post(f"{host}/engine/v1/{DENSE}/claim", json={"share": 0.5}, headers=as_gateway("greedy"))
        httpx.delete(f"{host}/engine/v1/{DENSE}/claim", headers=as_gateway("probe"))
        assert kv["num_blocks"] - 1 == int(pool * SHARE), (kv["num_blocks"], pool)
        assert greedy.status_code == 409, greedy.text
        return {"pool_blocks": pool, "gateway_blocks": kv["num_blocks"] - 1, "block_size": kv["block_size"],
                "gateway_slots": kv["max_num_seqs"], "greedy_claim": greedy.json()["error"]["code"]}  # fmt: skip

    def disconnect() -> dict[str, Any]:
        before = observe()["generation_tokens"]
        stream = client.chat.completions.create(
            model=DENSE, messages=[{"role": "user", "content": "go"}], max_tokens=3000, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        got = 0
        for c in stream:
            got += bool(c.choices and c.choices[0].delta.content)
            if got >= 3:
                break
        stream.close()
        t0 = time.monotonic()
        while observe()["unfinished"] and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        idle_s = time.monotonic() - t0
        after = observe()
        assert after["unfinished"] == 0
        return {"host_idle_after_s": round(idle_s, 3), "tokens_generated": after["generation_tokens"] - before}

    check("chat", chat)
    check("stream_and_prefix_cache", stream_and_cache)
    check("kv_share", share)
    check("client_disconnect_aborts_on_host", disconnect)
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("--host", "--gateway"):
        serve(sys.argv[1][2:], sys.argv[2])
        return 0
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="remote-smoke-"))
    cache = str(work / "cache")
    model_dir = prepare_model_dirs(work)[DENSE]
    result: dict[str, Any] = {"checks": {}}
    host_port, gw_port = free_port(), free_port()
    host_url, gw_url = f"http://127.0.0.1:{host_port}", f"http://127.0.0.1:{gw_port}"
    t0 = time.monotonic()
    host = launch("host", host_settings(model_dir, cache, host_port), work, "/engine/v1/health")
    result["host_ready_s"] = round(time.monotonic() - t0, 1)
    gw = None
    try:
        t1 = time.monotonic()
        gw = launch("gateway", gateway_settings(model_dir, cache, gw_port, host_port), work, "/ready")
        result["gateway_ready_s"] = round(time.monotonic() - t1, 1)
        result["checks"] = checks(host_url, gw_url)
        stop(host)  # the host goes away: the gateway answers 503, not a hang or a 500
        import httpx

        time.sleep(1.5)
        body = {"model": DENSE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        r = httpx.post(f"{gw_url}/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, json=body)
        ok = r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        result["checks"]["host_down_503"] = {"ok": ok, "status": r.status_code, "body": r.json()}
    finally:
        stop(host)
        if gw is not None:
            stop(gw)
        for kind in ("host", "gateway"):
            log = work / f"{kind}.log"
            if log.exists():
                (out_dir / f"remote_smoke_{kind}.log").write_text(log.read_text()[-20000:])
    try:
        import torch
        import vllm

        result["vllm"], result["torch"] = vllm.__version__, torch.__version__
        result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as e:
        result["versions_error"] = repr(e)
    result["passed"] = all(c.get("ok") for c in result["checks"].values())
    (out_dir / "remote_smoke.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "checks"}, indent=1))
    for name, c in result["checks"].items():
        print(name, "ok" if c.get("ok") else f"FAILED {c.get('error')}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
