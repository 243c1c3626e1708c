"""A real chat frontend against sparkgate: Open WebUI driven by headless Chromium.

Four checks, each in a new chat, typed into Open WebUI's message box as a person would:

  stream     sparkgate-tiny (random weights): the answer's text appears and grows while it
             streams (polled every 0.1 s), then the message completes.
  thinking   sparkgate-replay, "[[replay:think]]": the think block arrives as
             `reasoning_content` and Open WebUI shows it as its thinking block ("Thought
             for ..."), which opens on the recorded reasoning; the answer is shown without it.
  tool_call  sparkgate-replay, "[[replay:call]]": the streamed `tool_calls` come out as Open
             WebUI's tool-call element ("View Result from get_weather"), with the call's
             arguments and the tool's result inside; no raw `<tool_call>` text.
  image      sparkgate-vision (random weights, takes images): a 640x480 PNG made here is
             attached with the message box's own "+" > "Upload Files" (the browser's file
             chooser), the question typed and sent. The picture shows in the chat, the answer
             (noise, cut at 64 tokens) completes with no error toast and no error in the
             message, and the prompt carries the picture: its prompt tokens (Open WebUI's usage
             display; and the gateway's request log when this script started the gateway) less
             those of the same question without the picture (a second chat) are the picture's
             302 tokens (640x480: 300, and the vision start and end) plus Open WebUI's
             `<attached_files>` note naming the file (about 95, with its random id), each as
             the gateway counts it (/v1/messages/count_tokens), and the gateway's log has no
             "the engine counted" warning (vLLM's processor made the prompt it billed). What
             Open WebUI sends is recorded: it uploads the file as it is and its backend sends
             the stored bytes as a base64 data URL (format, size and bytes of the stored file).

Screenshots go to docs/frontend/*.png (stream-partial.png: mid-answer; image-attached.png: the
picture in the message box), the result to docs/frontend/last-run.json (date, versions, each
check's pass/fail and timings). Exit status 0 when every check passed.

Not part of `make test` (pytest collects tests/ only): it needs Open WebUI, Chromium and
a few minutes (the gateway's three engines take two or three to start). One-time setup,
outside the project's virtualenv (Open WebUI pins its own dependencies; install the CPU
torch first or pip pulls a multi-GB CUDA build):

    apt-get install -y chromium
    python3.11 -m venv .cache/webui-venv
    .cache/webui-venv/bin/pip install torch==2.13.0   # CPU wheel; any CPU torch will do
    .cache/webui-venv/bin/pip install open-webui playwright   # never `playwright install`

Run (starts the gateway with config/frontend.yaml and Open WebUI on free ports, offline,
with a fresh Open WebUI data directory, and stops both at the end):

    .cache/webui-venv/bin/python benchmarks/frontend_check.py [--project-python .venv/bin/python]

Or against running servers: --gateway-url http://127.0.0.1:8000 (serving sparkgate-tiny,
sparkgate-replay and sparkgate-vision, as config/frontend.yaml does; --gateway-log names its
log, else the image check goes by Open WebUI's usage display alone) and/or --webui-url
http://127.0.0.1:8080 (an Open WebUI with WEBUI_AUTH=False, pointed at that gateway). Either
way the script sets Open WebUI up as an admin would in Workspace > Tools and Models: it
registers a `get_weather` tool (its result carries `[[replay:answer]]`, so the replay engine
answers the follow-up turn instead of calling again) and attaches it to sparkgate-replay, and
ticks sparkgate-vision's "Vision" and "Usage" capabilities. Vision is on by default for a
model Open WebUI knows nothing about; Usage is not, and without it Open WebUI neither asks
for `stream_options.include_usage` nor shows the token counts.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.ports (run as a script, in another venv)
from tests.ports import free_port  # noqa: E402

OUT = ROOT / "docs" / "frontend"
WORK = ROOT / ".cache" / "frontend-check"
API_KEY = "sk-sparkgate-dev"
# Without the background-networking flags Chromium's own connections (updates, sync,
# field trials) fail en masse on a machine without internet; QUIC likewise.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

TOOL_ID = "sparkgate_weather"
TOOL_SOURCE = '''"""
title: Weather (sparkgate demo)
description: A canned weather tool for the replay engine's get_weather call.
"""


class Tools:
    def get_weather(self, city: str) -> str:
        """
        Get the current weather in a city.
        :param city: The city, e.g. Paris.
        """
        # The tag makes sparkgate's replay engine answer the follow-up turn with its
        # plain recording instead of calling the tool again.
        return f"Sunny, 21 °C in {city}. [[replay:answer]]"
'''

# The image check: a picture a person might attach, and what they ask about it.
VISION_MODEL = "sparkgate-vision"
PICTURE_SIZE = (640, 480)  # 300 image tokens for the tiny Qwen3.5 vision model's processor
PICTURE_QUESTION = "What shapes are in this picture?"

# The recordings (engine_adapter/recordings.py) the checks look for.
REASONING = "The user asks for the capital of France."
ANSWER = "The capital of France is Paris."

# The last assistant message as the page shows it: its whole text, the answer's markdown
# (outside the collapsible blocks), the thinking block's label, the tool-call element's
# text, and whether its action buttons (shown once the message is complete) are there.
_READ_LAST = """() => {
  const a = [...document.querySelectorAll('.chat-assistant')].pop();
  if (!a) return null;
  const msg = a.closest('[id^="message-"]') || a;
  const think = [...a.querySelectorAll('button[aria-expanded]')]
      .find(b => /Thought|Thinking/.test(b.innerText));
  const tool = a.querySelector('[id$="-tool-call"]');
  const prose = [...a.querySelectorAll('#response-content-container > div > .markdown-prose')];
  return {
    text: a.innerText,
    answer: prose.map(e => e.innerText).join('\\n').trim(),
    think: think ? think.innerText.trim() : null,
    tool: tool ? tool.innerText.trim() : null,
    done: !!msg.querySelector('button[aria-label="Regenerate"]'),
  };
}"""


# Open WebUI's toasts (svelte-sonner) on the page now; they vanish after a few seconds, so
# they are read at each poll. (A MutationObserver kept them all, but slowed the streaming
# answer's rendering: the stream check saw 4 updates instead of 13.)
_READ_TOASTS = """() => [...document.querySelectorAll('[data-sonner-toast]')].map(t => ({
  type: t.getAttribute('data-type'), text: (t.innerText || '').trim().slice(0, 300)
}))"""

# The picture as the chat shows it in the user's message (the stored file, as the browser
# decoded it), and the last answer's token counts as Open WebUI's usage display has them (the
# hidden text behind its "i" button, shown as a tooltip: a line a count).
_READ_PICTURE = """(fileId) => {
  const img = [...document.querySelectorAll('.chat-user img')].find(i => i.src.includes(fileId));
  return img ? {loaded: img.complete, width: img.naturalWidth, height: img.naturalHeight} : null;
}"""
_READ_USAGE = """() => {
  const u = [...document.querySelectorAll('span[id^="usage-"]')].pop();
  return u ? u.textContent : null;
}"""


def http(url: str, body: Any = None, token: str | None = None, timeout: float = 10) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]


def fetch_bytes(url: str, token: str, timeout: float = 10) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout: float, what: str) -> float:
    """Seconds until GET `url` answers 200 (raises when the process exits or time runs out)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see its log under {WORK}")
        with contextlib.suppress(OSError, ValueError):
            if http(url, timeout=5)[0] == 200:
                return time.monotonic() - t0
        time.sleep(1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s ({url})")


@contextlib.contextmanager
def started(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` in its own process group; end that group (this process's child) afterwards."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def gateway_env() -> dict[str, str]:
    cache = ROOT / ".cache"
    (cache / "rpc").mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TIKTOKEN_CACHE_DIR": str(cache / "tiktoken"),
        "VLLM_RPC_BASE_PATH": str(cache / "rpc"),
    }


def webui_env(gateway_url: str, data_dir: Path) -> dict[str, str]:
    """Open WebUI offline: no hub, no update check, no embedding model, no task-model calls."""
    return {
        **os.environ,
        "DATA_DIR": str(data_dir),
        "WEBUI_AUTH": "False",  # one automatic admin user, no sign-in page
        "WEBUI_SECRET_KEY": "sparkgate-frontend-check",
        "ENABLE_OLLAMA_API": "False",
        "ENABLE_OPENAI_API": "True",
        "OPENAI_API_BASE_URL": f"{gateway_url}/v1",
        "OPENAI_API_KEY": API_KEY,
        "OFFLINE_MODE": "True",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(data_dir / "hf"),
        "ENABLE_VERSION_UPDATE_CHECK": "False",
        # The default RAG embedding model (sentence-transformers/all-MiniLM-L6-v2) would be
        # loaded from the hub at start-up: an empty name loads none (no documents here).
        "RAG_EMBEDDING_MODEL": "",
        "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "False",
        "RAG_RERANKING_MODEL_AUTO_UPDATE": "False",
        "WHISPER_MODEL_AUTO_UPDATE": "False",
        "BYPASS_EMBEDDING_AND_RETRIEVAL": "True",
        # Title, tag and follow-up generation are extra model calls after each answer.
        "ENABLE_TITLE_GENERATION": "False",
        "ENABLE_TAGS_GENERATION": "False",
        "ENABLE_FOLLOW_UP_GENERATION": "False",
        "ENABLE_PERSISTENT_CONFIG": "False",
        "ANONYMIZED_TELEMETRY": "False",
        "SCARF_NO_ANALYTICS": "true",
        "DO_NOT_TRACK": "true",
    }


def set_model(webui: str, token: str, name: str, meta: dict[str, Any]) -> None:
    """A model's settings in Open WebUI (Workspace > Models): create, or update when there."""
    model = {"id": name, "base_model_id": None, "name": name, "meta": meta, "params": {}}
    status, body = http(f"{webui}/api/v1/models/create", model, token)
    if status != 200:
        status, body = http(f"{webui}/api/v1/models/model/update", model, token)
    if status != 200:
        raise RuntimeError(f"setting {name} up in Open WebUI: {status} {body}")


def set_up_webui(webui: str, token: str) -> None:
    """The get_weather tool, attached to sparkgate-replay (create, or update when there), and
    sparkgate-vision's Vision and Usage capabilities ticked."""
    tool = {"id": TOOL_ID, "name": "Weather", "content": TOOL_SOURCE, "meta": {"description": "canned weather"}}
    status, body = http(f"{webui}/api/v1/tools/create", tool, token)
    if status != 200:
        status, body = http(f"{webui}/api/v1/tools/id/{TOOL_ID}/update", tool, token)
    if status != 200:
        raise RuntimeError(f"registering the tool: {status} {body}")
    set_model(webui, token, "sparkgate-replay", {"toolIds": [TOOL_ID]})
    set_model(webui, token, VISION_MODEL, {"capabilities": {"vision": True, "usage": True}})


def make_picture(path: Path) -> bytes:
    """A 640x480 PNG of a few shapes, as a person might attach; its bytes."""
    img = Image.new("RGB", PICTURE_SIZE, (240, 240, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle((40, 40, 260, 200), fill=(200, 30, 30))
    draw.ellipse((320, 120, 560, 360), fill=(30, 80, 200))
    draw.polygon([(100, 440), (220, 260), (340, 440)], fill=(30, 160, 60))
    draw.line((380, 420, 620, 420), fill=(20, 20, 20), width=6)
    img.save(path, format="PNG")
    return path.read_bytes()


def describe_picture(data: bytes) -> dict[str, Any]:
    with Image.open(io.BytesIO(data)) as img:
        return {
            "format": img.format,
            "size": list(img.size),
            "mode": img.mode,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()[:16],
        }


def attached_files_note(files: list[dict[str, Any]]) -> str:
    """The text part Open WebUI 0.12 puts before a user message's own when files are attached
    and tools are called natively (utils/middleware.py, add_file_context): it names each file
    for its built-in file tools. Its token count varies with the file's random id."""
    tags = []
    for f in files:
        attrs = f'type="{f.get("type", "file")}" id="{f.get("id") or f.get("url")}"'
        attrs += "".join(f' {k}="{f[k]}"' for k in ("url", "content_type", "name") if f.get(k))
        tags.append(f"<file {attrs}/>")
    return "<attached_files>\n" + "\n".join(tags) + "\n</attached_files>\n\n"


def added_tokens(gateway: str, data: bytes, media_type: str, note: str) -> dict[str, int] | None:
    """What the picture, and the picture with Open WebUI's note, add to the question's prompt
    as the gateway counts them (/v1/messages/count_tokens, the model's chat template)."""
    picture = {"type": "image", "source": {"type": "base64", "media_type": media_type}}
    picture["source"]["data"] = base64.b64encode(data).decode()
    question = {"type": "text", "text": PICTURE_QUESTION}
    counts = []
    for content in ([question], [question, picture], [{"type": "text", "text": note}, question, picture]):
        body = {"model": VISION_MODEL, "messages": [{"role": "user", "content": content}]}
        status, answer = http(f"{gateway}/v1/messages/count_tokens", body, API_KEY)
        if status != 200:
            return None
        counts.append(answer["input_tokens"])
    return {"picture": counts[1] - counts[0], "picture_and_note": counts[2] - counts[0]}


def parse_usage(text: str | None) -> dict[str, int]:
    """Open WebUI's usage display, a line a count ("prompt_tokens: 7021"): the counts."""
    return {k: int(v) for k, v in re.findall(r"^\s*(\w+): (\d+)\s*$", text or "", re.M)}


def log_size(log: Path | None) -> int:
    return log.stat().st_size if log is not None and log.exists() else 0


def log_since(log: Path, offset: int) -> str:
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def logged_requests(log: Path | None, offset: int, model: str, wait_s: float = 5) -> list[dict[str, str]]:
    """The gateway's request-log lines (logger sparkgate.request, one a request, written when its
    response has ended) for chat completions of `model` since `offset`, as key=value fields."""
    if log is None:
        return []
    t0 = time.monotonic()
    while True:
        found = []
        for line in log_since(log, offset).splitlines():
            _, sep, rest = line.partition(" sparkgate.request: request ")
            fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv) if sep else {}
            if fields.get("path") == "/v1/chat/completions" and fields.get("served_model") == model:
                found.append(fields)
        if found or time.monotonic() - t0 > wait_s:
            return found
        time.sleep(0.2)


def open_chat(page: Page, webui: str, model: str) -> None:
    """A new chat with `model` selected in the model menu."""
    page.goto(f"{webui}/", wait_until="load")
    page.wait_for_selector("#chat-input", timeout=60_000)
    time.sleep(1.5)  # the release-notes dialog, when it comes, comes after the input
    lets_go = page.get_by_text("Okay, Let's Go!")
    if lets_go.count():
        lets_go.first.click()
    page.click("#model-selector-model-button")
    page.get_by_role("button", name=model).or_(page.get_by_text(model, exact=True)).first.click()
    selected = page.get_attribute("#model-selector-model-button", "aria-label") or ""
    if model not in selected:
        raise RuntimeError(f"could not select {model}: {selected!r}")


def note_toasts(page: Page, seen: list[dict[str, str]]) -> None:
    for toast in page.evaluate(_READ_TOASTS):
        if toast not in seen:
            seen.append(toast)


def send_and_watch(
    page: Page,
    message: str,
    partial_shot: Path | None = None,
    timeout: float = 120,
    toasts: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Type `message`, press Enter, and poll the answer (and any toast) every 0.1 s until it
    is complete (with `partial_shot`, a screenshot the first time part of it is there);
    `toasts`: those seen before, to go on with."""
    toasts = [] if toasts is None else toasts
    page.click("#chat-input")
    page.keyboard.type(message)
    t0 = time.monotonic()
    page.keyboard.press("Enter")
    first_text = None
    lengths: list[int] = []
    labels: list[str] = []  # the thinking block's labels as they changed
    last: dict[str, Any] | None = None
    while time.monotonic() - t0 < timeout:
        last = page.evaluate(_READ_LAST)
        note_toasts(page, toasts)
        if last and last["text"].strip():
            if first_text is None:
                first_text = time.monotonic() - t0
                if partial_shot is not None and not last["done"]:
                    page.screenshot(path=str(partial_shot))
                    partial_shot = None
            if not lengths or lengths[-1] != len(last["text"]):
                lengths.append(len(last["text"]))
            if last["think"] and (not labels or labels[-1] != last["think"]):
                labels.append(last["think"])
            if last["done"]:
                break
        time.sleep(0.1)
    done = time.monotonic() - t0
    time.sleep(0.5)  # let the last render settle
    last = page.evaluate(_READ_LAST) or {}
    note_toasts(page, toasts)
    return {
        "final": last,
        "toasts": toasts,
        "final_text_head": last.get("text", "")[:300],
        "complete": bool(last.get("done")),
        "first_text_s": round(first_text, 2) if first_text is not None else None,
        "done_s": round(done, 2),
        "text_updates": len(lengths),
        "text_lengths": lengths[:60],
        "think_labels": labels,
    }


def check_stream(page: Page, webui: str) -> dict[str, Any]:
    open_chat(page, webui, "sparkgate-tiny")
    w = send_and_watch(page, "Hello! Tell me about the DGX Spark.", partial_shot=OUT / "stream-partial.png")
    page.screenshot(path=str(OUT / "stream.png"))
    answer = w["final"].get("answer", "")
    checks = {
        "answer_shown": len(answer) > 0,
        "completed": w["complete"],
        # More than two distinct lengths: the text grew while it arrived, not in one piece.
        "streamed": w["text_updates"] >= 3,
    }
    return {"name": "stream", "model": "sparkgate-tiny", "checks": checks, "answer_chars": len(answer), **w}


def check_thinking(page: Page, webui: str) -> dict[str, Any]:
    open_chat(page, webui, "sparkgate-replay")
    w = send_and_watch(page, "What is the capital of France? [[replay:think]]")
    final = w["final"]
    opened = ""
    if final.get("think"):
        button = page.locator(".chat-assistant button[aria-expanded]").last
        button.click()
        time.sleep(0.7)
        opened = button.locator("xpath=..").inner_text()
    page.screenshot(path=str(OUT / "thinking.png"))
    checks = {
        "thinking_block_shown": bool(final.get("think")),
        "thinking_block_has_reasoning": REASONING in opened,
        "answer_without_reasoning": final.get("answer") == ANSWER,
        "no_raw_think_tags": "<think>" not in final.get("text", "") and "</think>" not in final.get("text", ""),
        # Open WebUI labels the block "Thinking..." while reasoning arrives, then "Thought for".
        "thinking_shown_while_streaming": any(label.startswith("Thinking") for label in w["think_labels"]),
        "completed": w["complete"],
        "streamed": w["text_updates"] >= 3,
    }
    return {
        "name": "thinking",
        "model": "sparkgate-replay",
        "checks": checks,
        "thinking_label": final.get("think"),
        "thinking_opened": opened[:400],
        **w,
    }


def check_tool_call(page: Page, webui: str) -> dict[str, Any]:
    open_chat(page, webui, "sparkgate-replay")
    w = send_and_watch(page, "What's the weather in Paris? [[replay:call]]")
    final = w["final"]
    opened = ""
    if final.get("tool"):
        element = page.locator('.chat-assistant [id$="-tool-call"]').last
        element.locator("[role=button]").first.click()
        time.sleep(0.7)
        opened = element.inner_text()
    page.screenshot(path=str(OUT / "tool-call.png"))
    tool = final.get("tool") or ""
    checks = {
        "tool_call_shown": "get_weather" in tool,
        "tool_call_has_arguments": "Paris" in opened,
        "tool_result_shown": "Sunny, 21 °C in Paris" in opened,
        "no_raw_tool_call_text": "<tool_call>" not in final.get("text", "") and "{" not in final.get("answer", ""),
        "completed": w["complete"],
    }
    return {
        "name": "tool_call",
        "model": "sparkgate-replay",
        "checks": checks,
        "tool_call_label": tool,
        "tool_call_opened": opened[:600],
        **w,
    }


def check_image(page: Page, webui: str, token: str, gateway: str, log: Path | None) -> dict[str, Any]:
    picture = WORK / "shapes.png"
    made = make_picture(picture)
    open_chat(page, webui, VISION_MODEL)
    # The message box's "+" menu, "Upload Files": Open WebUI's hidden file input opens the
    # browser's file chooser, where a person would pick the file.
    t0 = time.monotonic()
    page.click("#input-menu-button")
    with page.expect_file_chooser() as chooser:
        page.get_by_role("menuitem", name="Upload Files").click()
    with page.expect_response(lambda r: "/api/v1/files/" in r.url and r.request.method == "POST") as posted:
        chooser.value.set_files(str(picture))
    upload = posted.value
    uploaded = upload.json() if upload.ok else {}
    file_id = uploaded.get("id") or "(none)"
    # Its thumbnail in the message box: the upload is done and the message may be sent.
    page.locator(f'img[src*="{file_id}"]').first.wait_for(timeout=15_000)
    upload_s = time.monotonic() - t0
    page.screenshot(path=str(OUT / "image-attached.png"))
    toasts: list[dict[str, str]] = []
    note_toasts(page, toasts)  # e.g. "Selected model(s) do not support image inputs"

    offset = log_size(log)
    w = send_and_watch(page, PICTURE_QUESTION, toasts=toasts)
    shown = page.evaluate(_READ_PICTURE, file_id)
    usage = parse_usage(page.evaluate(_READ_USAGE))
    info = page.locator('button[id^="info-"]')  # the answer's usage, as a person sees it
    if info.count():
        info.last.hover()
        time.sleep(0.7)
    page.screenshot(path=str(OUT / "image.png"))
    logged = logged_requests(log, offset, VISION_MODEL)
    # gateway/lifecycle/generate.py warns when vLLM's processor made a prompt of another length
    # than the gateway counted (and billed), e.g. an image's tokens counted wrong.
    miscounted = [ln for ln in log_since(log, offset).splitlines() if "the engine counted" in ln] if log else []
    chat_id = page.url.rsplit("/c/", 1)[-1] if "/c/" in page.url else None
    status, chat = http(f"{webui}/api/v1/chats/{chat_id}", token=token) if chat_id else (None, None)
    messages = list(chat["chat"]["history"]["messages"].values()) if status == 200 else []
    errors = [m["error"] for m in messages if m.get("error")]
    files = [f for m in messages if m.get("role") == "user" for f in m.get("files", [])]

    # What Open WebUI sends: its backend reads the stored file and sends its bytes as a
    # base64 data URL whose type it guesses from the file name (utils/files.py).
    stored = fetch_bytes(f"{webui}/api/v1/files/{file_id}/content", token) if upload.ok else b""
    sent = describe_picture(stored) if stored else {}
    sent["same_as_attached"] = stored == made
    sent["content_type"] = (uploaded.get("meta") or {}).get("content_type")
    note = attached_files_note(files)
    expected = added_tokens(gateway, stored, sent["content_type"] or "image/png", note) if stored else None

    # The same question without the picture, in another chat: the prompts' difference is the
    # picture's tokens (Open WebUI's system prompt and built-in tools are the same in both).
    offset = log_size(log)
    open_chat(page, webui, VISION_MODEL)
    plain = send_and_watch(page, PICTURE_QUESTION)
    plain_usage = parse_usage(page.evaluate(_READ_USAGE))
    plain_logged = logged_requests(log, offset, VISION_MODEL)

    prompt, plain_prompt = usage.get("prompt_tokens"), plain_usage.get("prompt_tokens")
    added = prompt - plain_prompt if prompt is not None and plain_prompt is not None else None
    answer = w["final"].get("answer", "")
    checks = {
        "picture_uploaded": upload.ok and uploaded.get("id") is not None,
        "picture_shown_in_chat": bool(shown and shown["loaded"] and shown["width"] > 0),
        "answer_shown": len(answer) > 0,
        "completed": w["complete"],
        "no_error_toast": not [t for t in w["toasts"] if t["type"] in ("error", "warning")],
        "no_error_in_message": status == 200 and not errors,
        "usage_shown": prompt is not None,
        # The picture's tokens (302 for 640x480) reached the engine's prompt...
        "prompt_has_picture_tokens": bool(expected and added is not None and added >= expected["picture"] >= 300),
        # ... and the prompt grew by them and Open WebUI's note naming the file, no more, no less.
        "prompt_tokens_accounted_for": bool(expected and added == expected["picture_and_note"]),
    }
    if log is not None:
        checks["gateway_logged_it"] = (
            len(logged) == 1
            and logged[0].get("status") == "200"
            and logged[0].get("outcome") == "ok"
            and logged[0].get("prompt_tokens") == str(prompt)
        )
        checks["engine_counted_alike"] = not miscounted
    return {
        "name": "image",
        "model": VISION_MODEL,
        "checks": checks,
        "attached": {"size": list(PICTURE_SIZE), "format": "PNG", "bytes": len(made)},
        "sent": sent,
        "sent_files": [{k: f.get(k) for k in ("type", "content_type", "name", "size")} for f in files],
        "attached_files_note": note,
        "shown_in_chat": shown,
        "upload_s": round(upload_s, 2),
        "usage": usage,
        "gateway_log": logged,
        "tokens_expected": expected,
        "without_picture": {"usage": plain_usage, "gateway_log": plain_logged, "done_s": plain["done_s"]},
        "tokens_added_to_prompt": added,
        "answer_chars": len(answer),
        "message_errors": errors,
        "engine_counted_otherwise": miscounted,
        **w,
    }


def run(args: argparse.Namespace) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/frontend_check.py", *sys.argv[1:]]),
        "versions": {
            "open-webui": importlib.metadata.version("open-webui"),
            "playwright": importlib.metadata.version("playwright"),
            "sparkgate": subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
        },
        "setup": {},
        "checks": [],
    }
    with contextlib.ExitStack() as stack:
        gateway = args.gateway_url
        if gateway is None:
            port = free_port()
            gateway = f"http://127.0.0.1:{port}"
            cmd = [args.project_python, "-m", "gateway.cli", "serve", "--config", args.config, "--port", str(port)]
            proc = stack.enter_context(started(cmd, gateway_env(), WORK / "gateway.log", ROOT))
            result["setup"]["gateway_start_s"] = round(wait_ready(f"{gateway}/ready", proc, 600, "the gateway"), 1)
        result["setup"]["gateway_url"] = gateway
        # The image check reads the request lines of the gateway's log: its own, or one named.
        log = WORK / "gateway.log" if args.gateway_url is None else None
        log = Path(args.gateway_log) if args.gateway_log else log
        webui = args.webui_url
        if webui is None:
            port = free_port()
            webui = f"http://127.0.0.1:{port}"
            data = WORK / "webui-data"
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(parents=True)
            exe = str(Path(sys.executable).parent / "open-webui")
            cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port)]
            proc = stack.enter_context(started(cmd, webui_env(gateway, data), WORK / "webui.log", WORK))
            result["setup"]["webui_start_s"] = round(wait_ready(f"{webui}/health", proc, 300, "Open WebUI"), 1)
        result["setup"]["webui_url"] = webui

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
            result["versions"]["chromium"] = browser.version
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            t0 = time.monotonic()
            page.goto(f"{webui}/", wait_until="load")
            page.wait_for_selector("#chat-input", timeout=60_000)
            result["setup"]["first_page_load_s"] = round(time.monotonic() - t0, 2)
            token = page.evaluate("localStorage.token")
            set_up_webui(webui, token)
            checks = {
                "stream": lambda: check_stream(page, webui),
                "thinking": lambda: check_thinking(page, webui),
                "tool_call": lambda: check_tool_call(page, webui),
                "image": lambda: check_image(page, webui, token, gateway, log),
            }
            for name, check in checks.items():
                try:
                    outcome = check()
                except Exception as e:  # one broken check must not hide the others' results
                    outcome = {"name": name, "checks": {"ran": False}, "error": repr(e)}
                    with contextlib.suppress(Exception):
                        page.screenshot(path=str(OUT / f"{outcome['name']}-error.png"))
                if "final" in outcome:
                    outcome["final"].pop("text", None)
                    outcome["final"]["answer"] = outcome["final"].get("answer", "")[:300]
                outcome["passed"] = all(outcome["checks"].values())
                result["checks"].append(outcome)
                mark = "PASS" if outcome["passed"] else "FAIL"
                print(f"{mark} {outcome['name']}: {outcome['checks']} ({outcome.get('done_s')} s)", flush=True)
            browser.close()
    result["passed"] = all(c["passed"] for c in result["checks"])
    (OUT / "last-run.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    n_pass = sum(c["passed"] for c in result["checks"])
    print(f"{n_pass} passed, {len(result['checks']) - n_pass} failed; {OUT.relative_to(ROOT)}/last-run.json")
    return 0 if result["passed"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway-url", help="a running sparkgate (else one is started)")
    p.add_argument("--gateway-log", help="a running sparkgate's log (its request lines), for the image check")
    p.add_argument("--webui-url", help="a running Open WebUI with WEBUI_AUTH=False (else one is started)")
    p.add_argument("--project-python", default=str(ROOT / ".venv" / "bin" / "python"), help="to start the gateway")
    p.add_argument("--config", default="config/frontend.yaml", help="the gateway's config when it is started")
    p.add_argument("--chromium", default="/usr/bin/chromium", help="Debian's chromium (no Playwright browser)")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
