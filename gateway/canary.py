"""The canary: does a model still answer right from its prefix cache?

Speculative decoding with prefix caching on hybrid models has open reports of answers that
go wrong only on a cache hit (policies/known_issues.py). The canary sends each served model a
fixed tool-call prompt twice at temperature 0: first cold (a fresh cache_salt, and the run's
nonce in the prompt's first line, so that even an engine host that drops the salt cannot have
it cached), then again, now from the prefix cache. It compares the parsed tool calls (the
text, where there are none) and, where the model has prefix caching on, that the second
reported cached prompt tokens. A mismatch marks the model degraded: /ready and /metrics say
so, the dashboard shows it, and routing's aliases send requests elsewhere while another model
can serve (gateway/router.py). A passing run clears it.

It goes through the gateway's own path in this process: `prepare_chat` (the chat template,
tool-call format, budget), admission (it waits for its turn like any request, so it never
over-commits a pool), the engine and the chat body's encoder (the tool-call parser). It holds
no quota (no user's budget is charged) and no routing flight (it names its model).

Where it cannot mean anything it is skipped: simulated engines (the box model's text is not
a model's), and replay engines without their simulated prefix cache (a recording is the same
every time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from gateway.auth import Principal
from gateway.canary_state import Answer, Result
from gateway.errors import GatewayError
from gateway.http.openai import output
from gateway.job import Job
from gateway.lifecycle import generate
from gateway.lifecycle.prepare import demand, prepare_chat
from gateway.lifecycle.requests import ChatCompletionRequest
from gateway.registry import ServedModel
from gateway.state import AppState

log = logging.getLogger(__name__)

PRINCIPAL = Principal("sparkgate-canary", key_id="canary")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city's name, e.g. Paris"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = "What is the weather in Paris right now? Call get_weather to find out."
# Padding so that the prompt spans whole KV blocks (a hybrid model caches only whole blocks,
# thousands of tokens each): fixed text, the same in every run.
_NOTE = "Reference note {i}: answer by calling the tool that fits; never invent a result."


def compare(cold: Answer, cached: Answer, *, prefix_caching: bool) -> str | None:
    """Why the two answers show a fault (None: they agree)."""
    if cold.cached_tokens:
        return None  # not cold: nothing to compare (the caller calls it an error)
    if cold.calls != cached.calls:
        return f"tool calls differ: cold {list(cold.calls)}, from the cache {list(cached.calls)}"
    if not cold.calls and cold.content != cached.content:
        return f"answers differ: cold {cold.content[:80]!r}, from the cache {cached.content[:80]!r}"
    if prefix_caching and cached.cached_tokens == 0:
        return f"no prefix-cache hit on an identical {cached.prompt_tokens}-token prompt (prefix caching is on)"
    return None


def skip_reason(served: ServedModel) -> str | None:
    """Why the canary means nothing on this model (None: it runs)."""
    s = served.settings
    if s.canary is False:
        return "canary: false in its settings"
    if s.engine == "simulated":
        return "simulated engine: its text is not a model's"
    if s.engine == "replay" and not s.replay.prefix_cache and s.canary is None:
        return "replay engine without its prefix cache: a recording is the same every time"
    return None


def _request(served: ServedModel, nonce: str, max_tokens: int) -> ChatCompletionRequest:
    spec = served.engine.kv_spec
    # Two whole blocks and some: the second request then has at least one to find cached.
    want_tokens = 2 * spec.block_size + 64
    notes = "\n".join(_NOTE.format(i=i) for i in range(want_tokens // 12 + 1))
    system = f"Canary run {nonce}. You are a careful assistant with tools.\n{notes}"
    body = {
        "model": served.name,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "temperature": 0,
        "seed": 0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    return ChatCompletionRequest.model_validate(body)


def _answer(body: dict[str, Any]) -> Answer:
    message = body["choices"][0]["message"]
    calls = []
    for c in message.get("tool_calls") or ():
        raw = c["function"]["arguments"]
        try:
            args = json.loads(raw)
        except ValueError:
            args = raw
        calls.append((c["function"]["name"], args))
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Answer(
        calls=tuple(calls),
        content=message.get("content") or "",
        cached_tokens=int(details.get("cached_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
    )


async def _ask(state: AppState, job: Job) -> Answer:
    """One request through admission, the engine and the chat encoder; no quota, no flight."""
    ticket = await state.admission.acquire(demand(job, priority=0, user_max_running=None))
    try:
        bs = job.served.engine.kv_spec.block_size
        chunks = generate.run(job, on_prefill=lambda cached: ticket.prefilled(cached // bs))
        try:
            body = await output.complete(job, chunks)
        finally:
            await chunks.aclose()
    finally:
        ticket.release()
    return _answer(body)


async def _check(state: AppState, served: ServedModel) -> Result:
    nonce = uuid.uuid4().hex
    req = _request(served, nonce, state.settings.canary.max_tokens)
    answers = []
    for _ in range(2):
        job = await prepare_chat(req.model_copy(deep=True), state.registry, PRINCIPAL, state.settings.limits)
        salted = tuple(dataclasses.replace(r, cache_salt=f"canary:{nonce}") for r in job.requests)
        answers.append(await _ask(state, dataclasses.replace(job, requests=salted)))
    cold, cached = answers
    now = time.time()
    if cold.cached_tokens:
        return Result(served.name, "error", "the first request was not cold", now, cold, cached)
    why = compare(cold, cached, prefix_caching=served.engine.kv_spec.prefix_caching)
    if why is not None:
        return Result(served.name, "degraded", why, now, cold, cached)
    return Result(served.name, "ok", "same answer cold and from the cache", now, cold, cached)


async def check_model(state: AppState, served: ServedModel) -> Result:
    """The canary on one model; any failure to run it is an "error" result, never raised."""
    why = skip_reason(served)
    if why is not None:
        return Result(served.name, "skipped", why, time.time())
    if not served.engine.is_healthy:
        return Result(served.name, "error", "its engine is down", time.time())
    try:
        return await asyncio.wait_for(_check(state, served), state.settings.canary.timeout_s)
    except TimeoutError:
        return Result(served.name, "error", f"no answer within {state.settings.canary.timeout_s:g} s", time.time())
    except GatewayError as e:
        return Result(served.name, "error", e.message, time.time())
    except Exception as e:  # an engine failure: the engine's supervision reports it
        log.warning("canary %s: %s", served.name, e, exc_info=True)
        return Result(served.name, "error", f"{type(e).__name__}: {e}", time.time())


async def run(state: AppState, models: Iterable[ServedModel] | None = None) -> list[Result]:
    """The canary on each model in turn (all served ones by default), recorded in the book."""
    book = state.canary
    async with book.lock:
        results = []
        for served in list(state.registry) if models is None else models:
            result = await check_model(state, served)
            book.record(result)
            level = logging.WARNING if result.status in ("degraded", "error") else logging.INFO
            log.log(level, "canary %s: %s (%s)", served.name, result.status, result.reason)
            results.append(result)
        return results
