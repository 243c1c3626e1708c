"""A real chat frontend against sparkgate: Open WebUI driven by headless Chromium.

Three checks, each in a new chat, typed into Open WebUI's message box as a person would:

  stream     sparkgate-tiny (random weights): the answer's text appears and grows while it
             streams (polled every 0.1 s), then the message completes.
  thinking   sparkgate-replay, "[[replay:think]]": the think block arrives as
             `reasoning_content` and Open WebUI shows it as its thinking block ("Thought
             for ..."), which opens on the recorded reasoning; the answer is shown without it.
  tool_call  sparkgate-replay, "[[replay:call]]": the streamed `tool_calls` come out as Open
             WebUI's tool-call element ("View Result from get_weather"), with the call's
             arguments and the tool's result inside; no raw `<tool_call>` text.

Screenshots go to docs/frontend/*.png (stream-partial.png: mid-answer), the result to docs/frontend/last-run.json (date,
versions, each check's pass/fail and timings). Exit status 0 when every check passed.

Not part of `make test` (pytest collects tests/ only): it needs Open WebUI, Chromium and
a minute or two. One-time setup, outside the project's virtualenv (Open WebUI pins its own
dependencies; install the CPU torch first or pip pulls a multi-GB CUDA build):

    apt-get install -y chromium
    python3.11 -m venv .cache/webui-venv
    .cache/webui-venv/bin/pip install torch==2.13.0   # CPU wheel; any CPU torch will do
    .cache/webui-venv/bin/pip install open-webui playwright   # never `playwright install`

Run (starts the gateway with config/frontend.yaml and Open WebUI on free ports, offline,
with a fresh Open WebUI data directory, and stops both at the end):

    .cache/webui-venv/bin/python benchmarks/frontend_check.py [--project-python .venv/bin/python]

Or against running servers: --gateway-url http://127.0.0.1:8000 (serving sparkgate-tiny and
sparkgate-replay, as config/frontend.yaml does) and/or --webui-url http://127.0.0.1:8080 (an
Open WebUI with WEBUI_AUTH=False, pointed at that gateway). Either way the script registers
a `get_weather` tool in Open WebUI (its result carries `[[replay:answer]]`, so the replay
engine answers the follow-up turn instead of calling again) and attaches it to
sparkgate-replay, as an admin would in Workspace > Tools and Models.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
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


def register_tool(webui: str, token: str) -> None:
    """The get_weather tool, attached to sparkgate-replay (create, or update when there)."""
    tool = {"id": TOOL_ID, "name": "Weather", "content": TOOL_SOURCE, "meta": {"description": "canned weather"}}
    status, body = http(f"{webui}/api/v1/tools/create", tool, token)
    if status != 200:
        status, body = http(f"{webui}/api/v1/tools/id/{TOOL_ID}/update", tool, token)
    if status != 200:
        raise RuntimeError(f"registering the tool: {status} {body}")
    model = {"id": "sparkgate-replay", "base_model_id": None, "name": "sparkgate-replay"}
    model |= {"meta": {"toolIds": [TOOL_ID]}, "params": {}}
    status, body = http(f"{webui}/api/v1/models/create", model, token)
    if status != 200:
        status, body = http(f"{webui}/api/v1/models/model/update", model, token)
    if status != 200:
        raise RuntimeError(f"attaching the tool to sparkgate-replay: {status} {body}")


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


def send_and_watch(page: Page, message: str, partial_shot: Path | None = None, timeout: float = 120) -> dict[str, Any]:
    """Type `message`, press Enter, and poll the answer every 0.1 s until it is complete
    (with `partial_shot`, a screenshot the first time part of it is there)."""
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
    return {
        "final": last,
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
            result["setup"]["gateway_start_s"] = round(wait_ready(f"{gateway}/ready", proc, 300, "the gateway"), 1)
        result["setup"]["gateway_url"] = gateway
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
            register_tool(webui, page.evaluate("localStorage.token"))
            for check in (check_stream, check_thinking, check_tool_call):
                try:
                    outcome = check(page, webui)
                except Exception as e:  # one broken check must not hide the others' results
                    outcome = {
                        "name": check.__name__.removeprefix("check_"),
                        "checks": {"ran": False},
                        "error": repr(e),
                    }
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
    p.add_argument("--webui-url", help="a running Open WebUI with WEBUI_AUTH=False (else one is started)")
    p.add_argument("--project-python", default=str(ROOT / ".venv" / "bin" / "python"), help="to start the gateway")
    p.add_argument("--config", default="config/frontend.yaml", help="the gateway's config when it is started")
    p.add_argument("--chromium", default="/usr/bin/chromium", help="Debian's chromium (no Playwright browser)")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
