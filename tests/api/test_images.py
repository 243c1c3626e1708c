"""Images through the real clients to a real vision engine: the tiny Qwen3.5 vision model
(models/tiny-qwen3.5-vl: Qwen3.6-27B's architecture, the real processor config) on vLLM's CPU
engine, beside a text model, with routing on.

Every image's tokens are counted by the gateway as vLLM's processor makes them: the usage the
SDKs read equals the count below (text tokens + each image's pads), and the engine reports the
same prompt length (the gateway logs any difference: `the engine counted`). Bad images get a
4xx in the asking API's shape before any hold, and nothing stays held.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from PIL import Image
from transformers import AutoTokenizer

from gateway.settings import hash_key
from policies.images import VisionSpec, resize
from tests import agent_clients
from tests.conftest import MODELS, Fleet, Launch, Server, free_port, server_section

pytestmark = pytest.mark.engine  # starts vLLM engines

VISION = "vision"
TEXT = "text"
KEY = "sk-images"
MAX_IMAGES = 4
MAX_BYTES = 1024 * 1024
METERED_KEY = "sk-images-metered"
METERED_DAILY = 2500  # tokens a day: one 1920x1080 image (2,042) and its words, not two


ENGINES = 2  # vLLM engines its server starts: the fleet starts it in a wave


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    latency = {"prefill_tokens_per_s": 20_000, "ttft_overhead_s": 0.05, "tpot_s": 0.008}
    cfg = {
        "server": server_section(port),
        "auth": {
            "required": True,
            "keys": [
                {"name": "viewer", "sha256": hash_key(KEY)},
                {"name": "metered", "sha256": hash_key(METERED_KEY), "daily_tokens": METERED_DAILY},
            ],
        },
        # Images by URL from this test's own server only (an image server inside the network).
        "image_fetch": {"enabled": True, "allow_hosts": ["localhost"], "private_hosts": ["localhost"]},
        # `best` takes the text model (higher quality) for text, and the vision model for images.
        "routing": {"enabled": True, "classes": {"interactive": {"deadline_s": 600}}},
        "models": [
            {
                "name": VISION,
                "path": str(MODELS / "tiny-qwen3.5-vl"),
                "max_model_len": 32768,
                # Its random weights seldom end a turn: the coding agents' requests stop here.
                "max_output_tokens": 64,
                "max_num_seqs": 4,
                "kv_cache_bytes": "64MiB",
                "quality": 1,
                "latency": latency,
                "images": {"max_images": MAX_IMAGES, "max_bytes": MAX_BYTES},
            },
            {
                "name": TEXT,
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": 4096,
                "max_num_seqs": 4,
                "kv_cache_bytes": "64MiB",
                "quality": 2,
                "latency": latency,
            },
        ],
    }
    path = tmp / "images.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "gateway.log", port)]


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


@pytest.fixture(scope="module")
def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def an(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(MODELS / "tiny-qwen3.5-vl")


def png(width: int, height: int, seed: int = 0) -> bytes:
    img = Image.new("RGB", (width, height), ((seed * 37) % 256, 90, 200))
    img.putpixel((0, 0), (seed % 256, 0, 0))
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def pads(width: int, height: int) -> int:
    spec = VisionSpec()
    w, h = resize(width, height, spec)
    return (w // 16) * (h // 16) // 4


def expected(tok: Any, content: list[dict[str, Any]], sizes: list[tuple[int, int]], **template: Any) -> int:
    """The prompt's length as vLLM's processor makes it: the template's tokens, each image's
    one pad replaced by its merged patches."""
    messages = [{"role": "user", "content": content}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template)
    return len(tok.encode(text, add_special_tokens=False)) + sum(pads(w, h) - 1 for w, h in sizes)


def no_count_differs(server: Server) -> None:
    log = server.log_path.read_text(errors="replace")
    assert "the engine counted" not in log, log[log.find("the engine counted") - 200 :][:600]


def idle(server: Server) -> None:
    """Nothing held: no job admitted or queued, no engine request left."""
    engine = server.stats(KEY)["engines"][VISION]
    assert engine["admission"]["used_blocks"] == 0 and engine["admission"]["queued"] == 0, engine["admission"]
    assert engine["inflight"] == 0 and engine["stats"]["unfinished"] == 0


SIZES = [(200, 120), (640, 480), (33, 500), (1024, 768)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_an_image_chat_bills_the_engines_prompt_length(oa: openai.OpenAI, tok: Any, server: Server, size: Any) -> None:
    w, h = size
    parts: Any = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(png(w, h)), "detail": "low"}},
    ]
    r = oa.chat.completions.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": parts}])
    assert r.usage is not None and r.choices[0].message.content is not None
    assert r.usage.prompt_tokens == expected(
        tok, [{"type": "text", "text": parts[0]["text"]}, {"type": "image"}], [size]
    )
    assert r.usage.completion_tokens == 4
    no_count_differs(server)


def test_two_images_streamed_with_usage(oa: openai.OpenAI, tok: Any, server: Server) -> None:
    parts: Any = [
        {"type": "image_url", "image_url": {"url": data_url(png(300, 200, 1))}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": data_url(png(100, 900, 2))}},
    ]
    stream = oa.chat.completions.create(
        model=VISION,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": parts}],
    )
    usage = [c.usage for c in stream if c.usage is not None]
    want = expected(
        tok, [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}], [(300, 200), (100, 900)]
    )
    assert len(usage) == 1 and usage[0].prompt_tokens == want and usage[0].completion_tokens == 5
    no_count_differs(server)


def test_echo_repeats_the_text_of_a_message_with_an_image(oa: openai.OpenAI) -> None:
    parts: Any = [
        {"type": "text", "text": "A photo of "},
        {"type": "image_url", "image_url": {"url": data_url(png(64, 64))}},
    ]
    r = oa.chat.completions.create(
        model=VISION,
        max_tokens=2,
        messages=[{"role": "user", "content": parts}],
        extra_body={"echo": True, "add_generation_prompt": False},
    )
    assert (r.choices[0].message.content or "").startswith("A photo of ")


def test_responses_input_image(oa: openai.OpenAI, tok: Any, server: Server) -> None:
    raw = png(512, 512, 3)
    r = oa.responses.create(
        model=VISION,
        max_output_tokens=16,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe it."},
                    {"type": "input_image", "image_url": data_url(raw), "detail": "auto"},
                ],
            }
        ],
    )
    assert r.status == "incomplete" or r.status == "completed"
    assert r.usage is not None
    want = expected(tok, [{"type": "text", "text": "Describe it."}, {"type": "image"}], [(512, 512)])
    assert r.usage.input_tokens == want
    no_count_differs(server)


def test_anthropic_image_blocks_count_and_bill_alike(an: anthropic.Anthropic, tok: Any, server: Server) -> None:
    image: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(33, 500, 4)).decode()},
    }
    messages: Any = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
    counted = an.messages.count_tokens(model=VISION, messages=messages).input_tokens
    # Anthropic's default: thinking off (the template's empty think block).
    content = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    assert counted == expected(tok, content, [(33, 500)], enable_thinking=False)
    m = an.messages.create(model=VISION, max_tokens=4, messages=messages)
    u = m.usage
    assert u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0) == counted
    with an.messages.stream(model=VISION, max_tokens=4, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 4
    no_count_differs(server)


def test_a_screenshot_in_a_tool_result(an: anthropic.Anthropic, server: Server) -> None:
    """What Claude Code sends after a screenshot tool: the image inside the tool_result."""
    shot = base64.b64encode(png(800, 600, 5)).decode()
    messages: Any = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "Here it is:"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot}},
                    ],
                }
            ],
        },
    ]
    tools: Any = [{"name": "screenshot", "description": "Take one.", "input_schema": {"type": "object"}}]
    counted = an.messages.count_tokens(model=VISION, messages=messages, tools=tools).input_tokens
    m = an.messages.create(model=VISION, max_tokens=4, messages=messages, tools=tools)
    u = m.usage
    assert u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0) == counted
    assert counted > pads(800, 600)
    no_count_differs(server)


def test_a_repeated_image_hits_the_prefix_cache(oa: openai.OpenAI) -> None:
    # 768 image tokens: two of the hybrid model's 384-token blocks, new to the cache.
    raw = png(1024, 768, 6)
    turn: Any = [{"type": "image_url", "image_url": {"url": data_url(raw)}}, {"type": "text", "text": "What is it?"}]
    first = oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": turn}])
    messages: Any = [
        {"role": "user", "content": turn},
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And the colour?"},
    ]
    second = oa.chat.completions.create(model=VISION, max_tokens=2, messages=messages)
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) >= 768
    # Another image of the same size shares nothing past the text before it.
    other: Any = [{"type": "image_url", "image_url": {"url": data_url(png(1024, 768, 7))}}, turn[1]]
    third = oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": other}])
    assert third.usage is not None and third.usage.prompt_tokens_details is not None
    assert (third.usage.prompt_tokens_details.cached_tokens or 0) < 384


def test_routing_sends_images_only_to_a_model_that_takes_them(oa: openai.OpenAI) -> None:
    text = oa.chat.completions.create(model="best", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert text.model == TEXT
    parts: Any = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(png(64, 64))}}]
    seen = oa.chat.completions.create(model="best", max_tokens=2, messages=[{"role": "user", "content": parts}])
    assert seen.model == VISION
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=TEXT, max_tokens=2, messages=[{"role": "user", "content": parts}])
    assert e.value.code == "images_not_supported" and f"'{TEXT}' does not take images" in e.value.message


def _bomb() -> bytes:
    """A 1-bit PNG declaring 30,000 x 30,000 pixels (900 megapixels) in a few hundred bytes."""
    side = 30_000
    row = b"\0" + b"\0" * (side // 8)
    body = zlib.compress(row * 64, 9)  # a truncated stream: its header alone is the bomb

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def _noise_png(size: int) -> bytes:
    img = Image.frombytes("RGB", (size, size), bytes((i * 7919) % 251 for i in range(size * size * 3)))
    out = io.BytesIO()
    img.save(out, "PNG", compress_level=0)
    return out.getvalue()


def _tiff() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64)).save(out, "TIFF")
    return out.getvalue()


BAD: list[tuple[str, str, int, str]] = [
    ("corrupt base64", "data:image/png;base64,!!!notbase64", 400, "invalid_image"),
    ("not an image", data_url(b"hello, world"), 400, "invalid_image"),
    ("not an image type", data_url(png(64, 64), "text/plain"), 400, "invalid_image"),
    ("unsupported format", data_url(_tiff(), "image/tiff"), 400, "invalid_image"),
    ("truncated", data_url(png(300, 300)[:-40]), 400, "invalid_image"),
    ("absurd aspect", data_url(png(2, 600)), 400, "image_aspect_ratio"),
    ("decompression bomb", data_url(_bomb()), 400, "image_too_large"),
    ("over max_bytes", data_url(_noise_png(700)), 413, "image_too_large_bytes"),
    ("a host not allowed", "https://example.com/cat.png", 400, "image_url_not_allowed"),
    ("a private address not allowed", "http://127.0.0.1:9/cat.png", 400, "image_url_not_allowed"),
]


@pytest.mark.parametrize(("url", "status", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_image_gets_a_clear_error_in_each_shape(
    oa: openai.OpenAI, an: anthropic.Anthropic, server: Server, url: str, status: int, code: str
) -> None:
    parts: Any = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(openai.APIStatusError) as e:
        oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": parts}])
    err = e.value.response.json()["error"]
    assert e.value.status_code == status and err["code"] == code, err
    assert err["param"].startswith("messages[0].content[1].image_url") and "Traceback" not in err["message"]
    if url.startswith("data:image/") and ";base64," in url:
        media, data = url[5:].split(";base64,")
        block: Any = {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        with pytest.raises(anthropic.APIStatusError) as a:
            an.messages.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": [block]}])
        body: Any = a.value.body
        assert a.value.status_code == status and body["type"] == "error"
        assert body["error"]["type"] == ("request_too_large" if status == 413 else "invalid_request_error")
    idle(server)
    ok = oa.chat.completions.create(model=VISION, max_tokens=1, messages=[{"role": "user", "content": "still here?"}])
    assert ok.choices[0].finish_reason == "length"


def test_limits_on_images(oa: openai.OpenAI, server: Server) -> None:
    one: Any = {"type": "image_url", "image_url": {"url": data_url(png(32, 32))}}
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": [one] * 5}])
    assert e.value.code == "too_many_images" and f"at most {MAX_IMAGES}" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "system", "content": [one]}])
    assert e.value.code == "unsupported_content" and "user messages" in e.value.message
    # The image token typed as text would reach the engine as an image with no pixels.
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(
            model=VISION, max_tokens=2, messages=[{"role": "user", "content": "hi <|image_pad|>"}]
        )
    assert e.value.code == "invalid_image_placeholder"
    idle(server)


def test_the_body_limit_leaves_room_for_an_image(server: Server) -> None:
    # A 5 MB image, base64 in the body: over the old 8 MiB default's share, within 32 MiB.
    url = data_url(b"\0" * (5 * 1024 * 1024))
    body = {
        "model": VISION,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
    }
    r = httpx.post(f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "image_too_large_bytes", r.text


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = png(640, 480, 9) if self.path == "/cat.png" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_image_by_url_from_an_allowed_host(oa: openai.OpenAI, tok: Any, server: Server) -> None:
    images = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    port = images.server_address[1]

    def ask(path: str) -> Any:
        parts = [
            {"type": "text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": f"http://localhost:{port}{path}"}},
        ]
        return oa.chat.completions.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": parts}])  # type: ignore[misc,list-item]

    try:
        usage = ask("/cat.png").usage
        assert usage is not None
        assert usage.prompt_tokens == expected(tok, [{"type": "text", "text": "hi"}, {"type": "image"}], [(640, 480)])
        with pytest.raises(openai.BadRequestError) as e:
            ask("/dog.png")
        assert e.value.code == "image_fetch_failed" and "HTTP 404" in e.value.message
    finally:
        images.shutdown()
    no_count_differs(server)


# --- the coding agents, as they ship, sending an image --------------------------------------
# The random weights' answer is cut at max_output_tokens (the agents report that as an error):
# what is checked is what reached the gateway, by its request log.


def _logged(server: Server, path: str) -> list[dict[str, str]]:
    return [f for f in server.requests_logged() if f.get("path") == path]


def _screenshot(tmp: Path) -> Path:
    path = tmp / "shot.png"
    path.write_bytes(png(640, 480, 11))
    return path


def _agent_env(home: Path, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), **extra}


def test_codex_sends_an_image(server: Server, tmp_path: Path) -> None:
    codex = agent_clients.install() / "codex"
    home = tmp_path / "codex-home"
    assert server.config is not None
    entries = agent_clients.codex_home(home, server.config, "--model", VISION)
    assert entries[VISION]["input_modalities"] == ["text", "image"] and entries[TEXT]["input_modalities"] == ["text"]
    env = _agent_env(home, CODEX_HOME=str(home), SPARKGATE_API_KEY=KEY)
    ask = [str(codex), "exec", "--json", "--skip-git-repo-check", "What is in this screenshot?"]
    prompts = []
    for extra in ([], ["--image", str(_screenshot(tmp_path))]):
        subprocess.run(ask + extra, cwd=tmp_path, env=env, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        last = _logged(server, "/v1/responses")[-1]
        assert last["status"] == "200" and last["served_model"] == VISION, last
        prompts.append(int(last["prompt_tokens"]))
    # The image's 300 tokens and its two markers (and Codex's few words around it).
    assert 302 <= prompts[1] - prompts[0] < 400, prompts
    no_count_differs(server)


def test_claude_code_sends_an_image(server: Server, tmp_path: Path) -> None:
    claude = agent_clients.install() / "claude"
    shot = base64.b64encode(_screenshot(tmp_path).read_bytes()).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot}}
    env = _agent_env(
        tmp_path / "home",
        ANTHROPIC_BASE_URL=server.base_url,
        ANTHROPIC_AUTH_TOKEN=KEY,
        ANTHROPIC_MODEL=VISION,
        ANTHROPIC_SMALL_FAST_MODEL=VISION,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS="64",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    prompts = []
    for content in (
        [{"type": "text", "text": "What is in this screenshot?"}],
        [{"type": "text", "text": "What is in this screenshot?"}, image],
    ):
        turn = json.dumps({"type": "user", "message": {"role": "user", "content": content}})
        before = len(_logged(server, "/v1/messages"))
        subprocess.run(
            [str(claude), "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"],
            input=turn + "\n",
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        turns = _logged(server, "/v1/messages")[before:]
        assert turns and all(t["status"] == "200" and t["served_model"] == VISION for t in turns), turns
        prompts.append(int(turns[0]["prompt_tokens"]))
    assert 302 <= prompts[1] - prompts[0] < 400, prompts
    no_count_differs(server)


def test_the_quota_charges_an_images_tokens(server: Server) -> None:
    client = openai.OpenAI(base_url=server.api, api_key=METERED_KEY, max_retries=0, timeout=300)
    parts: Any = [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": data_url(png(1920, 1080))}},
    ]
    first = client.chat.completions.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": parts}])
    assert first.usage is not None and first.usage.prompt_tokens > pads(1920, 1080)
    # The day's 2,500 tokens cannot hold the same request again: refused before it runs.
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": parts}])
    assert "daily" in e.value.message.lower() or "quota" in e.value.message.lower(), e.value.message
    idle(server)
