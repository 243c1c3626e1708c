"""Prompt normalization against the real engine: what vLLM reports as cached, with it on and off."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY, DENSE, RAW_KEY, Server

pytestmark = pytest.mark.engine


def post(server: Server, key: str, body: dict[str, Any]) -> httpx.Response:
    r = httpx.post(
        f"{server.api}/chat/completions",
        json={"model": DENSE, "max_tokens": 4, "temperature": 0, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r


def cached(r: httpx.Response) -> int:
    n = int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert int(r.headers["x-sparkgate-cached-tokens"]) == n
    return n


def team_system(stamp: str, topic: str) -> str:
    rules = " ".join(f"Rule {i}: answer about {topic} carefully and cite the handbook section {i}." for i in range(60))
    return f"You are the {topic} team's assistant.\nCurrent time: {stamp}\n{rules}"


def test_a_timestamp_in_the_system_prompt_no_longer_breaks_the_cache(server: Server) -> None:
    block = server.stats()["engines"][DENSE]["kv"]["block_size"]
    topic = uuid.uuid4().hex  # nothing else in the cache shares this prefix
    results = {}
    for key in (API_KEY, RAW_KEY):
        # The same request twice, six seconds apart by its system prompt's clock.
        first, again = (
            post(
                server,
                key,
                {
                    "messages": [
                        {"role": "system", "content": team_system(stamp, topic + key)},
                        {"role": "user", "content": "hi"},
                    ]
                },
            )
            for stamp in ("2026-11-29T10:00:01Z", "2026-11-29T10:00:07Z")
        )
        results[key] = (first, again)
    on_first, on_again = results[API_KEY]
    off_first, off_again = results[RAW_KEY]
    assert on_first.headers["x-sparkgate-prefix"] == "volatile" and off_first.headers["x-sparkgate-prefix"] == "off"
    prompt = on_again.json()["usage"]["prompt_tokens"]
    # On: everything but the moved line and the question is shared: all whole blocks before them.
    assert prompt > 4 * block and cached(on_again) >= prompt - 2 * block, (cached(on_again), prompt)
    # Off: the timestamp on the second line ends the shared chain in the first block.
    assert cached(off_again) == 0 and cached(off_first) == 0 and cached(on_first) == 0
    assert int(on_again.headers["x-sparkgate-cacheable-tokens"]) == (prompt - 1) // block * block


def test_the_next_turn_reuses_the_previous_turn_s_prompt(server: Server, hf_tokenizer: Any) -> None:
    """Thinking off: the generation prompt ends with an empty think block that the template
    drops from past answers. Normalized, turn 2 reuses all of turn 1's prompt; raw, it stops
    before that block."""
    block = server.stats()["engines"][DENSE]["kv"]["block_size"]
    topic = uuid.uuid4().hex
    kwargs = {"enable_thinking": False}
    got = {}
    for key in (API_KEY, RAW_KEY):
        m = pad_to_think_boundary(hf_tokenizer, f"Be brief. {topic} {key}", f"Tell me about {topic}.", kwargs, block)
        # The key in the system prompt keeps the two runs' caches apart.
        turn1 = post(server, key, {"messages": m, "chat_template_kwargs": kwargs})
        answer = turn1.json()["choices"][0]["message"]["content"]
        p1 = turn1.json()["usage"]["prompt_tokens"]
        turn2 = post(
            server,
            key,
            {
                "messages": [*m, {"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}],
                "chat_template_kwargs": kwargs,
            },
        )
        got[key] = (p1, cached(turn2), turn2.headers["x-sparkgate-prefix"])
    p1_on, on, changes = got[API_KEY]
    _, off, _ = got[RAW_KEY]
    assert "history" in changes
    assert on >= (p1_on - 1) // block * block > 0, got  # all of turn 1's prompt, to its last whole block
    assert off < on, got


def pad_to_think_boundary(
    tok: Any, system: str, question: str, kwargs: dict[str, Any], block: int
) -> list[dict[str, str]]:
    """Messages whose prompt ends 3 tokens past a block boundary: the last whole block then
    ends with the "<think>" that opens the empty think block of the generation prompt."""
    for pad in range(2 * block):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question + " please" * pad}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kwargs)
        if len(tok.encode(text, add_special_tokens=False)) % block == 3:
            return msgs
    raise AssertionError("no padding puts a block boundary inside the think block")
