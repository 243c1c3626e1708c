"""GPU smoke test: the sparkgate gateway with its in-process vLLM adapter on CUDA vLLM.

Standalone; installs nothing. Two engines (tiny dense Qwen3 and tiny Qwen3-MoE,
load_format=dummy, tokenizer + config only) behind `gateway.app.create_app`, served
by uvicorn in a child process (this script with `--serve`), driven by the official
`openai` SDK. Writes `<out>/gpu_smoke.json`.

    python3 benchmarks/gpu/gpu_smoke.py $OUT

Model dirs come from `.devwheels/extra/models/` (carried to the GPU machine); a
`tokenizer.json.xz` there is unpacked into a temp copy (the carry limit is 64 MiB).
Env overrides for a dry run on the CPU build: SMOKE_CPU=1 (small KV pools, core pins).
"""

from __future__ import annotations

import json
import logging
import lzma
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.ports import free_port  # noqa: E402

API_KEY = "sk-gpu-smoke"
DENSE = "tiny-dense"
MOE = "tiny-moe"
HEALTH_TIMEOUT_S = 400
DISCONNECT_MAX_TOKENS = 3500
CHECKS = (
    "chat_nonstream",
    "chat_stream_usage",
    "n2",
    "logprobs",
    "completions_echo",
    "both_models",
    "not_found",
    "context_exceeded",
    "unauthorized",
    "json_object",
    "full_control",
    "stream_disconnect",
    "nonstream_disconnect",
    "kv_sections",
)
OPTIONAL_CHECKS = {"unauthorized", "json_object", "full_control", "nonstream_disconnect"}


# --------------------------------------------------------------------------- setup


def prepare_model_dirs(work: Path) -> dict[str, str]:
    """Carried model dirs (tokenizer possibly xz-compressed) -> usable dirs."""
    candidates = {
        DENSE: [ROOT / ".devwheels/extra/models/tiny-qwen3-dense", ROOT / "models/tiny-qwen3"],
        MOE: [ROOT / ".devwheels/extra/models/tiny-qwen3-moe", ROOT / "models/tiny-qwen3-moe"],
    }
    out = {}
    for name, paths in candidates.items():
        src = next((p for p in paths if (p / "config.json").exists()), None)
        if src is None:
            raise FileNotFoundError(f"no model dir for {name}: {paths}")
        if (src / "tokenizer.json").exists():
            out[name] = str(src)
            continue
        dst = work / "models" / src.name
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name == "model.safetensors":
                continue
            if f.name.endswith(".xz"):
                (dst / f.name[:-3]).write_bytes(lzma.decompress(f.read_bytes()))
            else:
                shutil.copy2(f, dst / f.name)
        out[name] = str(dst)
    return out


def settings_dict(dirs: dict[str, str], cache_dir: str, port: int) -> dict[str, Any]:
    from gateway.settings import hash_key

    cpu = os.environ.get("SMOKE_CPU") == "1"
    dense: dict[str, Any] = {
        "name": DENSE,
        "aliases": ["dense-alias"],
        "path": dirs[DENSE],
        "load_format": "dummy",
        "max_model_len": 4096,
        "kv_cache_bytes": "64MiB" if cpu else "2GiB",
        "enforce_eager": True,
    }
    moe: dict[str, Any] = {
        "name": MOE,
        "path": dirs[MOE],
        "load_format": "dummy",
        "max_model_len": 2048,
        "kv_cache_bytes": "32MiB" if cpu else "1GiB",
        "enforce_eager": True,
    }
    if cpu:
        dense["cpu_cores"], moe["cpu_cores"] = "0", "1"
    extra = os.environ.get("SMOKE_ENGINE_ARGS")  # JSON, applied to both (only if 0.26 needs it)
    if extra:
        dense["engine_args"] = moe["engine_args"] = json.loads(extra)
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": cache_dir},
        "auth": {"required": True, "keys": [{"name": "smoke", "sha256": hash_key(API_KEY)}]},
        "models": [dense, moe],
        "limits": {"max_n": 4},
    }


# --------------------------------------------------------------------------- server (child)


def serve(settings_path: str, info_path: str) -> None:
    data = json.loads(Path(settings_path).read_text())
    from gateway import runtime_env

    runtime_env.configure(data["server"]["cache_dir"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    from gateway.app import create_app, vllm_engine
    from gateway.settings import Settings

    settings = Settings(**data)
    engines: list[Any] = []

    def factory(s: Any, m: Any) -> Any:
        e = vllm_engine(s, m)
        engines.append(e)
        return e

    def write_info() -> None:
        while len(engines) < len(settings.models) or any(e.startup_seconds is None for e in engines):
            time.sleep(0.5)
        info: dict[str, Any] = {"engines": {}}
        try:
            import torch
            import vllm

            info["vllm_version"] = vllm.__version__
            info["torch_version"] = torch.__version__
            info["cuda_available"] = torch.cuda.is_available()
            if torch.cuda.is_available():
                info["gpu"] = torch.cuda.get_device_name(0)
                free, total = torch.cuda.mem_get_info()
                info["gpu_mem_free_gib_after_start"] = round(free / 2**30, 2)
                info["gpu_mem_total_gib"] = round(total / 2**30, 2)
        except Exception as exc:
            info["version_error"] = repr(exc)
        for e in engines:
            d: dict[str, Any] = {"startup_seconds": round(e.startup_seconds, 2)}
            try:
                cc = e._llm.vllm_config.cache_config
                d["cache_config"] = {
                    k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                    for k in (
                        "block_size",
                        "num_gpu_blocks",
                        "kv_cache_memory_bytes",
                        "kv_cache_size_tokens",
                        "kv_cache_max_concurrency",
                        "cache_dtype",
                        "enable_prefix_caching",
                        "mamba_cache_mode",
                        "gpu_memory_utilization",
                    )
                    for v in [getattr(cc, k, "<absent>")]
                }
                d["attn_backend"] = str(getattr(e._llm.vllm_config, "attention_config", None))[:300]
            except Exception as exc:
                d["cache_config_error"] = repr(exc)
            info["engines"][e.name] = d
        Path(info_path).write_text(json.dumps(info, indent=1))

    threading.Thread(target=write_info, daemon=True).start()
    app = create_app(settings, engine_factory=factory)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=data["server"]["port"], log_level="info"))
    server.run()


# --------------------------------------------------------------------------- client checks


class Smoke:
    def __init__(self, base: str) -> None:
        import openai

        self.base = base
        self.openai = openai
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, timeout=180, max_retries=0)
        self.results: dict[str, Any] = {}

    # helpers
    def http_get(self, path: str, auth: bool = True) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.base + path)
        if auth:
            req.add_header("Authorization", f"Bearer {API_KEY}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stats(self) -> dict[str, Any]:
        code, body = self.http_get("/sparkgate/stats")
        assert code == 200, (code, body)
        return body  # type: ignore[no-any-return]

    def wait_idle(self, model: str = DENSE, timeout: float = 30.0) -> tuple[dict[str, Any], float]:
        t0 = time.monotonic()
        while True:
            e = self.stats()["engines"][model]
            if e["stats"]["unfinished"] == 0 and e["stats"]["running"] == 0 and e["inflight"] == 0:
                return e, time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"engine {model} still busy {timeout}s later: {e}")
            time.sleep(0.05)

    def check(self, name: str, fn: Any) -> None:
        t0 = time.monotonic()
        rec: dict[str, Any] = {}
        try:
            fn(rec)
            rec["ok"] = True
        except Exception as exc:
            rec["ok"] = False
            rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            rec["traceback"] = traceback.format_exc()[-3000:]
        rec["seconds"] = round(time.monotonic() - t0, 3)
        self.results[name] = rec
        print(f"[{'PASS' if rec['ok'] else 'FAIL'}] {name} ({rec['seconds']}s) {rec.get('error', '')}", flush=True)

    # checks
    def chat_nonstream(self, rec: dict[str, Any]) -> None:
        msgs = [{"role": "user", "content": "Hello! Tell me a story."}]
        r = self.client.chat.completions.create(model=DENSE, messages=msgs, max_tokens=16)
        rec["plain"] = {"finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump(), "model": r.model}
        if r.choices[0].finish_reason == "length":
            assert r.usage.completion_tokens == 16, r.usage
        r = self.client.chat.completions.create(
            model=DENSE, messages=msgs, max_tokens=24, extra_body={"ignore_eos": True}
        )
        c = r.choices[0]
        rec["ignore_eos"] = {
            "finish_reason": c.finish_reason,
            "usage": r.usage.model_dump(),
            "content_prefix": (c.message.content or "")[:80],
        }
        assert c.finish_reason == "length", c.finish_reason
        assert r.usage.completion_tokens == 24, r.usage
        assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 24
        assert r.model == DENSE, r.model

    def chat_stream_usage(self, rec: dict[str, Any]) -> None:
        stream = self.client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": "Stream please"}],
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        last = chunks[-1]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        usage_chunks = [i for i, ch in enumerate(chunks) if ch.usage is not None]
        rec.update(
            n_chunks=len(chunks),
            finish=finish,
            final_usage=last.usage.model_dump() if last.usage else None,
            usage_chunk_indexes=usage_chunks,
            text_len=len(text),
        )
        assert last.choices == [] and last.usage is not None, "final chunk is not usage-only"
        assert usage_chunks == [len(chunks) - 1], usage_chunks
        assert finish == ["length"], finish
        assert last.usage.completion_tokens == 20, last.usage

    def n2(self, rec: dict[str, Any]) -> None:
        r = self.client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": "two answers"}],
            max_tokens=10,
            n=2,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        rec.update(indexes=[c.index for c in r.choices], usage=r.usage.model_dump())
        assert sorted(c.index for c in r.choices) == [0, 1]
        assert r.usage.completion_tokens == 20, r.usage

    def logprobs(self, rec: dict[str, Any]) -> None:
        r = self.client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": "logprobs"}],
            max_tokens=8,
            logprobs=True,
            top_logprobs=3,
            extra_body={"ignore_eos": True},
        )
        content = r.choices[0].logprobs.content
        rec.update(
            n=len(content),
            first={
                "token": content[0].token,
                "logprob": content[0].logprob,
                "top": [t.logprob for t in content[0].top_logprobs],
            },
        )
        assert len(content) == r.usage.completion_tokens == 8
        for t in content:
            assert len(t.top_logprobs) == 3, t
            assert t.logprob <= 0.0
            tops = [x.logprob for x in t.top_logprobs]
            assert tops == sorted(tops, reverse=True), tops
            assert t.logprob <= tops[0] + 1e-3

    def completions_echo(self, rec: dict[str, Any]) -> None:
        prompts = ["The quick brown fox", "Once upon a time there"]
        r = self.client.completions.create(
            model=DENSE, prompt=prompts, max_tokens=5, echo=True, logprobs=2, extra_body={"ignore_eos": True}
        )
        rec["n_choices"] = len(r.choices)
        rec["usage"] = r.usage.model_dump()
        rec["choices"] = []
        assert len(r.choices) == 2
        for c in sorted(r.choices, key=lambda c: c.index):
            lp = c.logprobs
            rec["choices"].append(
                {
                    "index": c.index,
                    "text_prefix": c.text[:60],
                    "n_tokens": len(lp.tokens),
                    "first_lp": lp.token_logprobs[0],
                    "top_len": [len(t) if t else 0 for t in (lp.top_logprobs or [])][:8],
                }
            )
            assert c.text.startswith(prompts[c.index]), c.text
            assert c.finish_reason == "length"
            assert lp.token_logprobs[0] is None, lp.token_logprobs[:2]
            assert len(lp.tokens) > 5
        assert r.usage.completion_tokens == 10, r.usage

    def both_models(self, rec: dict[str, Any]) -> None:
        _code, models = self.http_get("/v1/models")
        ids = sorted(m["id"] for m in models["data"])
        rec["models"] = ids
        assert DENSE in ids and MOE in ids, ids
        for m in (DENSE, MOE, "dense-alias"):
            r = self.client.chat.completions.create(
                model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=6, extra_body={"ignore_eos": True}
            )
            rec[m] = {"model": r.model, "usage": r.usage.model_dump()}
            assert r.usage.completion_tokens == 6
        assert rec[MOE]["model"] == MOE

    def not_found(self, rec: dict[str, Any]) -> None:
        try:
            self.client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        except self.openai.NotFoundError as e:
            rec.update(status=e.status_code, body=e.body)
            assert e.status_code == 404 and (e.body or {}).get("code") == "model_not_found", e.body
            return
        raise AssertionError("no 404")

    def context_exceeded(self, rec: dict[str, Any]) -> None:
        cases = {
            "dense_max_tokens": dict(model=DENSE, messages=[{"role": "user", "content": "hi"}], max_tokens=5000),
            "moe_long_prompt": dict(model=MOE, messages=[{"role": "user", "content": "word " * 3000}]),
        }
        for key, kw in cases.items():
            try:
                self.client.chat.completions.create(**kw)
            except self.openai.BadRequestError as e:
                rec[key] = {
                    "status": e.status_code,
                    "code": (e.body or {}).get("code"),
                    "message": (e.body or {}).get("message"),
                }
                assert e.status_code == 400 and (e.body or {}).get("code") == "context_length_exceeded", e.body
                continue
            raise AssertionError(f"{key}: no 400")

    def unauthorized(self, rec: dict[str, Any]) -> None:
        import openai

        c = openai.OpenAI(base_url=f"{self.base}/v1", api_key="sk-wrong", max_retries=0)
        try:
            c.chat.completions.create(model=DENSE, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        except openai.AuthenticationError as e:
            rec.update(status=e.status_code)
            return
        raise AssertionError("no 401")

    def json_object(self, rec: dict[str, Any]) -> None:
        r = self.client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": "Reply in JSON."}],
            max_tokens=64,
            response_format={"type": "json_object"},
        )
        text = r.choices[0].message.content or ""
        rec.update(text=text[:200], finish=r.choices[0].finish_reason)
        if r.choices[0].finish_reason == "stop":
            json.loads(text)

    def full_control(self, rec: dict[str, Any]) -> None:
        s0, _ = self.wait_idle()
        r = self.client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": "go"}],
            max_tokens=300,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        s1, _ = self.wait_idle()
        delta = s1["stats"]["generation_tokens"] - s0["stats"]["generation_tokens"]
        rec.update(completion_tokens=r.usage.completion_tokens, generation_tokens_delta=delta)
        assert r.usage.completion_tokens == 300 and delta == 300, rec

    def stream_disconnect(self, rec: dict[str, Any]) -> None:
        s0, _ = self.wait_idle()
        disc0 = self.stats()["client_disconnects"]
        body = {
            "model": DENSE,
            "messages": [{"role": "user", "content": "go on forever"}],
            "stream": True,
            "max_tokens": DISCONNECT_MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 1.0,
        }
        headers = {"Authorization": f"Bearer {API_KEY}"}
        try:
            import httpx

            rec["client"] = "httpx"
            with (
                httpx.Client(timeout=30) as http,
                http.stream("POST", f"{self.base}/v1/chat/completions", json=body, headers=headers) as r,
            ):
                assert r.status_code == 200, r.status_code
                lines = r.iter_lines()
                got = [next(lines) for _ in range(6)]
                t_close = time.monotonic()
        except ImportError:
            import http.client

            rec["client"] = "http.client"
            host, port = self.base.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request(
                "POST", "/v1/chat/completions", json.dumps(body), {**headers, "Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            assert resp.status == 200, resp.status
            got = [resp.fp.readline().decode().rstrip("\n") for _ in range(6)]
            t_close = time.monotonic()
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        rec["lines"] = [g[:120] for g in got]
        assert any(g.startswith("data: ") for g in got)
        s1, _ = self.wait_idle(timeout=60)
        rec["seconds_to_idle"] = round(time.monotonic() - t_close, 3)
        delta = s1["stats"]["generation_tokens"] - s0["stats"]["generation_tokens"]
        rec["generation_tokens_delta"] = delta
        rec["max_tokens"] = DISCONNECT_MAX_TOKENS
        rec["client_disconnects_delta"] = self.stats()["client_disconnects"] - disc0
        rec["final_engine_stats"] = s1["stats"]
        assert 0 < delta < DISCONNECT_MAX_TOKENS // 2, delta
        assert rec["client_disconnects_delta"] == 1, rec["client_disconnects_delta"]

    def nonstream_disconnect(self, rec: dict[str, Any]) -> None:
        import urllib.error
        import urllib.request

        s0, _ = self.wait_idle()
        body = {
            "model": DENSE,
            "messages": [{"role": "user", "content": "go on forever"}],
            "max_tokens": DISCONNECT_MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 1.0,
        }
        req = urllib.request.Request(
            f"{self.base}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        t_close = time.monotonic()
        try:
            urllib.request.urlopen(req, timeout=0.3).read()
            rec["completed_before_timeout"] = True
        except (TimeoutError, urllib.error.URLError, OSError) as e:
            rec["client_error"] = type(e).__name__
            t_close = time.monotonic()
        s1, _ = self.wait_idle(timeout=60)
        rec["seconds_to_idle"] = round(time.monotonic() - t_close, 3)
        delta = s1["stats"]["generation_tokens"] - s0["stats"]["generation_tokens"]
        rec["generation_tokens_delta"] = delta
        assert delta < DISCONNECT_MAX_TOKENS // 2, delta

    def kv_sections(self, rec: dict[str, Any]) -> None:
        st = self.stats()
        for name, e in st["engines"].items():
            rec[name] = {"kv": e["kv"], "stats": e["stats"]}
            kv = e["kv"]
            assert kv["block_size"] > 0 and kv["num_blocks"] > 0 and kv["bytes_per_block"] > 0, kv


def run_client(out: Path) -> int:
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    result: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": sys.version.split()[0]}
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "gpu_smoke.json"

    def dump() -> None:
        result["total_seconds"] = round(time.monotonic() - t_start, 2)
        json_path.write_text(json.dumps(result, indent=1, default=str))

    dirs = prepare_model_dirs(work)
    port = free_port()
    settings = settings_dict(dirs, str(work / "cache"), port)
    result["settings"] = settings
    settings_path, info_path = work / "settings.json", work / "info.json"
    settings_path.write_text(json.dumps(settings))
    log_path = out / "server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(settings_path), str(info_path)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    import urllib.request

    t0 = time.monotonic()
    healthy = False
    while time.monotonic() - t0 < HEALTH_TIMEOUT_S:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=2) as r:
                if r.status == 200:
                    healthy = True
                    break
        except Exception:
            pass
        time.sleep(1)
    result["health_seconds"] = round(time.monotonic() - t0, 2)
    result["healthy"] = healthy
    print(f"health: {healthy} after {result['health_seconds']}s", flush=True)
    try:
        if not healthy:
            result["server_exit_code"] = proc.poll()
            return 1
        for _ in range(40):
            if info_path.exists():
                break
            time.sleep(0.25)
        if info_path.exists():
            result["server_info"] = json.loads(info_path.read_text())
        try:
            s = Smoke(base)
        except Exception:
            result["openai_client_error"] = traceback.format_exc()[-3000:]
            print(result["openai_client_error"], flush=True)
            return 3
        for name in CHECKS:
            s.check(name, getattr(s, name))
            result["checks"] = s.results
            dump()
        result["summary"] = {k: v["ok"] for k, v in s.results.items()}
        result["all_required_passed"] = all(s.results[k]["ok"] for k in CHECKS if k not in OPTIONAL_CHECKS)
        try:
            result["final_stats"] = s.stats()
        except Exception as exc:
            result["final_stats_error"] = repr(exc)
        return 0 if result["all_required_passed"] else 2
    finally:
        with_sig = proc.poll() is None
        if with_sig:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        result["server_exit_code"] = proc.returncode
        log.close()
        text = log_path.read_text(errors="replace")
        lines = text.splitlines()
        result["server_log_tail"] = lines[-60:]
        result["server_log_notable"] = [
            ln[:400]
            for ln in lines
            if any(w in ln for w in ("ERROR", "Traceback", "Error:", "WARNING", "ready in", "sparkgate ready"))
        ][:80]
        dump()
        print(json.dumps({k: result.get(k) for k in ("healthy", "health_seconds", "summary", "all_required_passed")}))
        if "server_info" in result:
            for n, e in result["server_info"].get("engines", {}).items():
                print(n, e.get("startup_seconds"), e.get("cache_config"))
        kvs = result.get("checks", {}).get("kv_sections", {})
        for n in (DENSE, MOE):
            if n in kvs:
                kv = kvs[n]["kv"]
                print(n, {k: kv[k] for k in ("block_size", "num_blocks", "bytes_per_block", "kv_cache_bytes")})
        sd = result.get("checks", {}).get("stream_disconnect", {})
        print("disconnect:", {k: sd.get(k) for k in ("seconds_to_idle", "generation_tokens_delta", "error")})
        if not healthy:
            print("\n".join(lines[-80:]))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", str(ROOT / "benchmarks/gpu/out"))
        sys.exit(run_client(Path(out_dir)))
