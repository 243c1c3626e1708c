"""Images on a real GPU: sparkgate against vLLM's own OpenAI server, the Qwen3.6-27B shape WITH its
vision tower (CUDA vLLM 0.26, dummy weights, the Qwen3.5/3.6 tokenizer and the real Qwen3.6
preprocessor configs).

Per image size (PIL-made PNGs of several sizes and aspect ratios), an OpenAI chat request with
text and the image as a data URL, through each server in turn (one engine on the GPU at a time,
the same engine settings on both):

- counts: one non-streamed request per size; `usage.prompt_tokens` from sparkgate (the gateway's
  own count: its KV reservation and bill) and from vLLM's server (vLLM's processor), and the
  expectation computed here independently: the chat template's text tokens (transformers'
  tokenizer) plus, per image, `policies.images.cost(...).tokens - 1` (the template writes one pad,
  the processor makes it N). The gateway logs `the engine counted N tokens, the gateway M` on any
  difference between its count and vLLM's `len(prompt_token_ids)`: the part greps its log.
- TTFT: streamed, `--reps` repetitions per size, every image unique (one pixel differs) so neither
  the prefix cache nor the processor cache sees it again; TTFT is the client's time to the first
  chunk with text. The count pass warms every size first.
- cache: a two-turn conversation whose first user turn holds a large image; turn 2 = turn 1 +
  a fixed assistant answer + new user text. `usage.prompt_tokens_details.cached_tokens` of each
  turn (vLLM's server reports it with `--enable-prompt-tokens-details`; sparkgate always does),
  non-streamed, then again streamed on another image (TTFT of both turns).

    python3 benchmarks/gpu/vision_check.py OUT --part gateway,vllm      # on the GPU machine
    python3 benchmarks/gpu/vision_check.py OUT --device cpu --sizes 200x120,640x480 --reps 1   # a dry run here
    python3 benchmarks/gpu/vision_check.py --table benchmarks/gpu/vision_check_result/*.json

Each part writes OUT/vision_check_PART.json after every case and its server's log to
OUT/PART.log. The model dir (/tmp/vision_check/model-27b) gets the shape's config.json and the
tokenizer files from `.devwheels/vm` or /tmp/vision_check/vm (tokenizer.json may be xz-compressed
there: carried to the GPU machine) or `models/tiny-qwen3.5-vl` (`make models`). `--device cpu`
serves models/tiny-qwen3.5-vl itself on vLLM's CPU build instead (a dry run of the whole script).

On the GPU machine (H100, 2026-12): vLLM's processor hashes images with `blake3`, which the image
lacks and `stage-vllm.sh` does not stage: carry its wheel (`.devwheels/whl`, installed into
/tmp/site) or both engines die at start in the encoder's profile (`No module named 'blake3'`).
Even with `enforce_eager` a server takes 230-250 s to be healthy (about 115 s of it profiling the
encoder cache with the largest image), and on a fresh machine the first image request JITs for
about a minute (the count pass absorbs it): one part per 10-minute call, `--budget` ~250.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import lzma
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.gpu.side_by_side import stop, wait_health  # noqa: E402
from tests.ports import free_port  # noqa: E402

SHAPE = ROOT / "benchmarks/gpu/shapes/qwen3.6-27b.config.json"
TINY = ROOT / "models/tiny-qwen3.5-vl"
WORK = Path("/tmp/vision_check")
SOURCES = (ROOT / ".devwheels/vm", WORK / "vm", TINY)  # the tokenizer and processor files, first found
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
API_KEY = "sk-vision-check"
MODEL = "vision"
MAX_IMAGES = 4
SIZES = "200x120,640x480,33x500,1024x768,1920x1080,3000x2000"
CACHE_SIZES = "1024x768,1920x1080"
PROMPT = "Describe this image in one sentence."
FOLLOW_UP = "Which colour is strongest in its top-left corner?"
ANSWER = "A smooth gradient from dark to light, with a bright circle in the middle."  # turn 1's, fixed
MAX_TOKENS = 8  # non-streamed requests
STREAM_TOKENS = 4  # streamed (TTFT) requests
STRUCTURED = {"backend": "xgrammar", "disable_any_whitespace": True}  # what sparkgate's adapter sets


def engine_settings(device: str) -> dict[str, Any]:
    """The engine arguments both servers get (vLLM's names)."""
    common = {
        "max_model_len": 32768,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 8192,  # the largest image here (5,830 tokens) prefills in one step
        "enable_prefix_caching": True,
        "enforce_eager": True,  # no torch.compile, no CUDA graphs: a start of about a minute
        "seed": 0,
    }
    if device == "cpu":
        return common | {"kv_cache_memory_bytes": 256 * 1024**2}
    return common | {
        "kv_cache_memory_bytes": 8 * 1024**3,  # ~120K tokens of the 27B's bf16 KV
        "load_format": "dummy",
        "dtype": "bfloat16",
        "gdn_prefill_backend": "triton",  # no FlashInfer on the GPU machine
    }


def parse_sizes(text: str) -> list[tuple[int, int]]:
    return [(int(w), int(h)) for w, h in (s.split("x") for s in text.split(",") if s)]


def model_dir(device: str) -> Path:
    """The 27B shape's config with its vision tower, and the Qwen3.5/3.6 tokenizer and processor."""
    if device == "cpu":
        return TINY
    out = WORK / "model-27b"
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(SHAPE.read_text())
    assert "vision_config" in config and config.get("image_token_id") == 248056, "not the vision shape"
    config["language_model_only"] = False
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for src in SOURCES:
        if (src / "tokenizer.json").is_file() or (src / "tokenizer.json.xz").is_file():
            for name in MODEL_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, out / name)
                elif (src / f"{name}.xz").is_file():
                    (out / name).write_bytes(lzma.decompress((src / f"{name}.xz").read_bytes()))
                else:
                    raise FileNotFoundError(f"{src / name}")
            return out
    raise FileNotFoundError("no tokenizer: .devwheels/vm, /tmp/vision_check/vm or models/tiny-qwen3.5-vl")


# --------------------------------------------------------------------------- requests


def png(width: int, height: int, seed: int) -> bytes:
    """Gradients (a PNG of a few hundred KB at most), made unique by the first pixel's colour."""
    from PIL import Image

    r = Image.linear_gradient("L").resize((width, height))
    g = Image.linear_gradient("L").rotate(90).resize((width, height))
    b = Image.radial_gradient("L").resize((width, height))
    image = Image.merge("RGB", (r, g, b))
    image.putpixel((0, 0), (seed & 255, (seed >> 8) & 255, (seed >> 16) & 255))
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return out.getvalue()


def user_turn(width: int, height: int, seed: int) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png(width, height, seed)).decode()
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}],
    }


def two_turns(width: int, height: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    first = [user_turn(width, height, seed)]
    return first, [*first, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": FOLLOW_UP}]


def body(messages: list[dict[str, Any]], stream: bool) -> bytes:
    b: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": STREAM_TOKENS if stream else MAX_TOKENS,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        b["stream_options"] = {"include_usage": True}
    return json.dumps(b).encode()


def chat(port: int, payload: bytes, stream: bool) -> dict[str, Any]:
    """POST /v1/chat/completions (the same client for both servers). Non-streamed: the response
    and its time. Streamed: TTFT (the first chunk with text), the time to the last, the usage."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:1000]!r}")
        if not stream:
            data = json.loads(resp.read())
            return {"total_s": time.perf_counter() - t0, "usage": data.get("usage"), "response": data}
        first_chunk = first_text = None
        usage = None
        text = ""
        while line := resp.readline():
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                break
            now = time.perf_counter()
            d = json.loads(line[6:])
            if d.get("choices") and first_chunk is None:
                first_chunk = now
            for c in d.get("choices") or []:
                delta = c.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                if piece:
                    first_text = now if first_text is None else first_text
                    text += piece
            if d.get("usage"):
                usage = d["usage"]
        end = time.perf_counter()
        return {
            "ttft_s": (first_text if first_text is not None else end) - t0,
            "first_chunk_s": None if first_chunk is None else first_chunk - t0,
            "total_s": end - t0,
            "text_seen": first_text is not None,
            "usage": usage,
            "text": text,
        }
    finally:
        conn.close()


def cached(usage: dict[str, Any] | None) -> int | None:
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


# --------------------------------------------------------------------------- expectations


class Expect:
    """Prompt lengths as vLLM's processor makes them, computed here: the template's text tokens
    (transformers' tokenizer of the model dir) plus, per image, its pads from `policies.images`
    minus the one pad the template writes."""

    def __init__(self, model: Path) -> None:
        from gateway.vision import spec_of
        from policies.images import ImageLimits

        self.spec = spec_of(json.loads((model / "preprocessor_config.json").read_text()))
        self.limits = ImageLimits()
        self.error: str | None = None
        try:
            from transformers import AutoTokenizer

            self.tok: Any = AutoTokenizer.from_pretrained(str(model))
        except Exception as e:  # the table still gets the image tokens
            self.tok = None
            self.error = repr(e)

    def image(self, width: int, height: int) -> dict[str, Any]:
        from policies.images import ImageCost, cost

        c = cost(width, height, self.spec, self.limits)
        assert isinstance(c, ImageCost), c
        return {"resized": f"{c.width}x{c.height}", "pads": c.tokens}

    def prompt(self, messages: list[dict[str, Any]]) -> int | None:
        if self.tok is None:
            return None
        sizes = []
        for m in messages:
            for part in m["content"] if isinstance(m["content"], list) else []:
                if part["type"] == "image_url":
                    from PIL import Image

                    raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                    sizes.append(Image.open(io.BytesIO(raw)).size)
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        n = len(self.tok.encode(text, add_special_tokens=False))
        return n + sum(self.image(w, h)["pads"] - 1 for w, h in sizes)


# --------------------------------------------------------------------------- servers


def child_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_CACHE_ROOT", str(WORK / "vllm-cache"))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")
    return env


def start_gateway(device: str, model: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, dict[str, Any]]:
    from gateway.settings import hash_key

    port = free_port()
    es = engine_settings(device)
    own = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enforce_eager"}
    own |= {"load_format", "dtype", "seed"}
    entry: dict[str, Any] = {"name": MODEL, "path": str(model), "images": {"max_images": MAX_IMAGES}}
    entry |= {k: v for k, v in es.items() if k in own}
    entry["kv_cache_bytes"] = es["kv_cache_memory_bytes"]
    # vLLM's own names, verbatim; the gateway adds limit_mm_per_prompt {"image": 4, "video": 0}
    entry["engine_args"] = {k: v for k, v in es.items() if k not in own and k != "kv_cache_memory_bytes"}
    settings = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(WORK / "cache")},
        "auth": {"required": True, "keys": [{"name": "bench", "sha256": hash_key(API_KEY)}]},
        "models": [entry],
    }
    path = WORK / "gateway.json"
    path.write_text(json.dumps(settings, indent=1))
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(device), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, port, {"command": cmd, "settings": settings}


def start_vllm_server(device: str, model: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, dict[str, Any]]:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    cmd += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--api-key", API_KEY]
    for k, v in engine_settings(device).items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            cmd.append(flag)
        elif v is not False:
            cmd += [flag, str(v)]
    cmd += ["--limit-mm-per-prompt", json.dumps({"image": MAX_IMAGES, "video": 0})]  # as the gateway passes
    cmd += ["--structured-outputs-config", json.dumps(STRUCTURED)]
    cmd += ["--enable-prompt-tokens-details"]
    proc = subprocess.Popen(cmd, cwd=WORK, env=child_env(device), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, port, {"command": cmd}


# Lines of either server's log worth keeping in the result: the KV pool, its blocks, the backends.
ENGINE_LINES = re.compile(
    r"KV cache|num_gpu_blocks|block_size|block size|mamba|prefix cach|attention backend|vit attention"
    r"|encoder cache|Loading weights took|Model loading took|init engine|torch.compile|the engine counted"
    r"|Traceback|Error",
    re.IGNORECASE,
)


def versions() -> dict[str, Any]:
    got: dict[str, Any] = {}
    for name in ("vllm", "torch", "transformers", "torchvision", "PIL"):
        try:
            got[name] = __import__(name).__version__
        except Exception as e:
            got[name] = f"unavailable: {e!r}"
    try:
        import torch

        got["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception as e:
        got["gpu"] = repr(e)
    return got


def run_part(part: str, a: argparse.Namespace, expect: Expect, model: Path) -> dict[str, Any]:
    started = time.monotonic()
    sizes = parse_sizes(a.sizes)
    cache_sizes = parse_sizes(a.cache_sizes)
    log = a.out / f"{part}.log"
    result: dict[str, Any] = {
        "part": part,
        "device": a.device,
        "versions": versions(),
        "engine": engine_settings(a.device) | {"limit_mm_per_prompt": {"image": MAX_IMAGES, "video": 0}},
        "model_dir": str(model),
        "reps": a.reps,
        "counts": [],
        "ttft": [],
        "cache": [],
    }
    if expect.error:
        result["expect_error"] = expect.error
    dest = a.out / f"vision_check_{part}{'_' + a.tag if a.tag else ''}.json"

    def save() -> None:
        dest.write_text(json.dumps(result, indent=1))

    # Every request's body before the server starts (the images are the same on both servers).
    seed = 1
    count_bodies = []
    for w, h in sizes:
        msgs = [user_turn(w, h, seed)]
        count_bodies.append(((w, h), msgs, body(msgs, False)))
        seed += 1
    warm = [body([user_turn(w, h, 10_000 + i)], True) for i, (w, h) in enumerate(sizes)]
    ttft_bodies = [
        [((w, h), body([user_turn(w, h, 20_000 + 100 * r + i)], True)) for i, (w, h) in enumerate(sizes)]
        for r in range(a.reps)
    ]
    convs = [((w, h), two_turns(w, h, 30_000 + i), two_turns(w, h, 40_000 + i)) for i, (w, h) in enumerate(cache_sizes)]

    start = start_gateway if part == "gateway" else start_vllm_server
    proc, port, launch = start(a.device, model, log)
    result["launch"] = launch
    try:
        result["startup_s"] = round(wait_health(port, proc, log, a.start_timeout), 1)
        healthy = time.monotonic()
        print(f"[{part}] healthy after {result['startup_s']} s", flush=True)
        save()
        # counts (also the warm-up of every size)
        for (w, h), msgs, payload in count_bodies:
            r = chat(port, payload, False)
            usage = r["usage"] or {}
            row = {
                "image": f"{w}x{h}",
                **expect.image(w, h),
                "expected_prompt_tokens": expect.prompt(msgs),
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
                "cached_tokens": cached(usage),
                "total_s": round(r["total_s"], 3),
            }
            result["counts"].append(row)
            print(json.dumps(row), flush=True)
            save()
        for payload in warm:  # the streamed path, every size once
            chat(port, payload, True)
        # cache: two turns, non-streamed, then two more on another image, streamed
        for (w, h), (first, second), (first_s, second_s) in convs:
            t1 = chat(port, body(first, False), False)
            t2 = chat(port, body(second, False), False)
            s1 = chat(port, body(first_s, True), True)
            s2 = chat(port, body(second_s, True), True)
            row = {
                "image": f"{w}x{h}",
                "turn1_prompt_tokens": (t1["usage"] or {}).get("prompt_tokens"),
                "turn1_cached_tokens": cached(t1["usage"]),
                "turn2_prompt_tokens": (t2["usage"] or {}).get("prompt_tokens"),
                "turn2_cached_tokens": cached(t2["usage"]),
                "turn2_expected_prompt_tokens": expect.prompt(second),
                "stream_turn1_ttft_ms": round(1000 * s1["ttft_s"], 2),
                "stream_turn1_cached_tokens": cached(s1["usage"]),
                "stream_turn2_ttft_ms": round(1000 * s2["ttft_s"], 2),
                "stream_turn2_cached_tokens": cached(s2["usage"]),
                "stream_turn2_prompt_tokens": (s2["usage"] or {}).get("prompt_tokens"),
            }
            result["cache"].append(row)
            print(json.dumps(row), flush=True)
            save()
        # TTFT: repetitions interleaved over the sizes, every image new
        got: dict[str, list[dict[str, Any]]] = {f"{w}x{h}": [] for w, h in sizes}
        for r, rep in enumerate(ttft_bodies):
            if r and a.budget and time.monotonic() - healthy > a.budget:
                result["cut_after_reps"] = r
                print(f"[{part}] budget spent: {r} repetitions", flush=True)
                break
            for (w, h), payload in rep:
                x = chat(port, payload, True)
                got[f"{w}x{h}"].append(x)
        for key, xs in got.items():
            if not xs:
                continue
            ttfts = [1000 * x["ttft_s"] for x in xs]
            row = {
                "image": key,
                "n": len(xs),
                "ttft_p50_ms": round(statistics.median(ttfts), 2),
                "ttft_mean_ms": round(statistics.fmean(ttfts), 2),
                "ttft_ms": [round(t, 2) for t in ttfts],
                "first_chunk_ms": [
                    None if x["first_chunk_s"] is None else round(1000 * x["first_chunk_s"], 2) for x in xs
                ],
                "text_seen": sum(bool(x["text_seen"]) for x in xs),
                "prompt_tokens": sorted({(x["usage"] or {}).get("prompt_tokens") for x in xs}, key=str),
                "cached_tokens": sorted({cached(x["usage"]) for x in xs}, key=str),
            }
            result["ttft"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ttft_ms", "first_chunk_ms")}), flush=True)
        save()
    except Exception as e:
        result["error"] = repr(e)[-6000:]
        print(f"[{part}] failed: {e}", flush=True)
        save()
    finally:
        stop(proc, wait_s=90)  # an engine with its vision encoder takes longer to let go
    text = log.read_text(errors="replace") if log.exists() else ""
    result["mismatch_lines"] = [line for line in text.splitlines() if "the engine counted" in line]
    result["engine_log"] = [line[:400] for line in text.splitlines() if ENGINE_LINES.search(line)][:80]
    result["part_s"] = round(time.monotonic() - started, 1)
    save()
    print(f"[{part}] done in {result['part_s']} s: {len(result['mismatch_lines'])} count mismatches logged", flush=True)
    return result


# --------------------------------------------------------------------------- table


def table(parts: list[dict[str, Any]]) -> str:
    by = {p["part"]: p for p in parts}
    g, v = by.get("gateway", {}), by.get("vllm", {})
    out = []
    for p in parts:
        ver = p.get("versions", {})
        out.append(
            f"{p['part']}: {ver.get('gpu')}, vLLM {ver.get('vllm')}, transformers {ver.get('transformers')}, "
            f"torchvision {ver.get('torchvision')}; started in {p.get('startup_s')} s; "
            f"count mismatches logged: {len(p.get('mismatch_lines', []))}"
            + (f"; ERROR {p['error'][:300]}" if p.get("error") else "")
        )
    gc = {r["image"]: r for r in g.get("counts", [])}
    vc = {r["image"]: r for r in v.get("counts", [])}
    images = list(dict.fromkeys([*gc, *vc]))
    out += [
        "",
        "| image | resized | pads (policy) | expected prompt | sparkgate prompt | vLLM server prompt | match |",
        "|---|---|---|---|---|---|---|",
    ]
    for im in images:
        r = gc.get(im) or vc.get(im) or {}
        gp, vp, ep = (
            gc.get(im, {}).get("prompt_tokens"),
            vc.get(im, {}).get("prompt_tokens"),
            r.get("expected_prompt_tokens"),
        )
        known = [x for x in (gp, vp, ep) if x is not None]
        match = "yes" if len(known) == 3 and len(set(known)) == 1 else ("no" if len(set(known)) > 1 else "-")
        out.append(f"| {im} | {r.get('resized')} | {r.get('pads')} | {ep} | {gp} | {vp} | {match} |")
    gt = {r["image"]: r for r in g.get("ttft", [])}
    vt = {r["image"]: r for r in v.get("ttft", [])}
    out += [
        "",
        "| image | prompt tokens | n | sparkgate TTFT p50 ms | vLLM server TTFT p50 ms | ratio | sparkgate - vLLM ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for im in images:
        a, b = gt.get(im), vt.get(im)
        n = "/".join(str(x["n"]) for x in (a, b) if x)
        pt = (gc.get(im) or vc.get(im) or {}).get("prompt_tokens")
        ratio = f"{a['ttft_p50_ms'] / b['ttft_p50_ms']:.3f}" if a and b else "-"
        diff = f"{a['ttft_p50_ms'] - b['ttft_p50_ms']:+.1f}" if a and b else "-"
        ga, vb = (x["ttft_p50_ms"] if x else "-" for x in (a, b))
        out.append(f"| {im} | {pt} | {n} | {ga} | {vb} | {ratio} | {diff} |")
    out += [
        "",
        "| image | server | turn 1 prompt / cached | turn 2 prompt (expected) / cached "
        "| streamed: turn 1 TTFT ms / cached | turn 2 TTFT ms / cached |",
        "|---|---|---|---|---|---|",
    ]
    for name, p in (("sparkgate", g), ("vLLM server", v)):
        for r in p.get("cache", []):
            out.append(
                f"| {r['image']} | {name} | {r['turn1_prompt_tokens']} / {r['turn1_cached_tokens']} | "
                f"{r['turn2_prompt_tokens']} ({r['turn2_expected_prompt_tokens']}) / {r['turn2_cached_tokens']} | "
                f"{r['stream_turn1_ttft_ms']} / {r['stream_turn1_cached_tokens']} | "
                f"{r['stream_turn2_ttft_ms']} / {r['stream_turn2_cached_tokens']} |"
            )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--part", default="gateway,vllm", help="gateway, vllm or both (comma-separated, in order)")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--sizes", default=SIZES, help="WxH,... images of the counts and TTFT cases")
    ap.add_argument("--cache-sizes", default=CACHE_SIZES, help="WxH,... images of the two-turn cache cases")
    ap.add_argument("--reps", type=int, default=7, help="TTFT repetitions per size")
    ap.add_argument(
        "--budget", type=float, default=0, help="seconds from a server's health after which no TTFT repetition starts"
    )
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--tag", default="", help="appended to the result files' names")
    ap.add_argument("--dry", action="store_true", help="write the model dir, expectations and settings; start nothing")
    ap.add_argument("--table", nargs="+", type=Path, help="print the comparison of these result files")
    a = ap.parse_args()
    if a.table:
        print(table([json.loads(p.read_text()) for p in a.table]))
        return 0
    if a.out is None:
        ap.error("OUT is required")
    a.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    model = model_dir(a.device)
    expect = Expect(model)
    if a.dry:
        rows = []
        for w, h in parse_sizes(a.sizes):
            msgs = [user_turn(w, h, 1)]
            rows.append({"image": f"{w}x{h}", **expect.image(w, h), "expected_prompt_tokens": expect.prompt(msgs)})
        for w, h in parse_sizes(a.cache_sizes):
            rows.append({"image": f"{w}x{h}", "turn2_expected": expect.prompt(two_turns(w, h, 1)[1])})
        print(json.dumps({"model_dir": str(model), "files": sorted(os.listdir(model)), "expect_error": expect.error}))
        print("\n".join(json.dumps(r) for r in rows))
        print(json.dumps(engine_settings(a.device)))
        return 0
    parts = [p.strip() for p in a.part.split(",") if p.strip()]
    assert set(parts) <= {"gateway", "vllm"}, parts
    results = [run_part(p, a, expect, model) for p in parts]
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
