"""benchmarks/agent_sessions.py and its recorded sessions (benchmarks/data/agent_sessions/):
what Claude Code and Codex CLI sent over 10 turns, replayed with only the output budget
changed, and sparkgate's normalized prompts, turn after turn, repeating the previous one."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from benchmarks import agent_sessions as bench

BLOCK = 128  # the vLLM CPU engine's KV block (the replay's figures)


@functools.cache
def session(client: str) -> list[dict[str, Any]]:
    return bench.load(bench.DATA / f"{client}.jsonl.gz")


@functools.cache
def normalized(client: str) -> list[tuple[int, ...]]:
    norm = bench.Normalizer(bench.model_settings("128MiB"))
    return [norm.ids(r, bench.prepared(r, 4)) for r in session(client)]


@pytest.mark.parametrize("client", bench.CLIENTS)
def test_a_recorded_session_is_ten_turns_three_of_them_with_a_tool(client: str) -> None:
    records = session(client)
    turns = [r["turn"] for r in records]
    assert sorted(set(turns)) == list(range(1, 11))
    # A tool turn is two requests: the call, then the answer from its result.
    assert [t for t in set(turns) if turns.count(t) == 2] == sorted(bench.TOOL_TURNS)
    path = "/v1/messages" if client == "claude_code" else "/v1/responses"
    assert {r["path"] for r in records} == {path}
    assert all(r["body"]["stream"] is True for r in records)
    if client == "claude_code":
        assert {r["headers"]["anthropic-version"] for r in records} == {"2023-06-01"}
        assert {r["body"]["max_tokens"] for r in records} == {32000}
    else:
        assert all("max_output_tokens" not in r["body"] for r in records)


@pytest.mark.parametrize("client", bench.CLIENTS)
def test_a_replayed_body_changes_only_the_model_and_the_output_budget(client: str) -> None:
    record = session(client)[-1]
    body = bench.prepared(record, 4)
    budget = "max_tokens" if client == "claude_code" else "max_output_tokens"
    assert body.pop("model") == bench.SERVED and body.pop(budget) == 4
    assert body == {k: v for k, v in record["body"].items() if k not in ("model", budget)}


def test_vllm_gets_codex_apply_patch_without_its_grammar() -> None:
    record = session("codex")[0]
    sent = {t["name"]: t for t in record["body"]["tools"] if "name" in t}
    assert sent["apply_patch"]["format"]["type"] == "grammar"  # what vLLM 0.32 refuses
    body = bench.prepared(record, 4, for_vllm=True)
    got = {t["name"]: t for t in body["tools"] if "name" in t}
    assert "format" not in got["apply_patch"]
    assert {k: v for k, v in got.items() if k != "apply_patch"} == {k: v for k, v in sent.items() if k != "apply_patch"}


def test_usage_from_streams() -> None:
    # Anthropic: the total is input + cache read + cache creation; message_delta has the last word.
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 100, "output_tokens": 0}}},
        {"type": "message_delta", "usage": {"input_tokens": 20, "cache_read_input_tokens": 80, "output_tokens": 4}},
    ]
    assert bench.usage_of("/v1/messages", events) == (100, 80)
    done = {"usage": {"input_tokens": 300, "input_tokens_details": {"cached_tokens": 256}}}
    events = [
        {"type": "response.created", "response": {"usage": None}},
        {"type": "response.completed", "response": done},
    ]
    assert bench.usage_of("/v1/responses", events) == (300, 256)


def test_whole_blocks() -> None:
    assert bench.whole_blocks(0, 500, BLOCK) == 0
    assert bench.whole_blocks(300, 500, BLOCK) == 256
    assert bench.whole_blocks(384, 385, BLOCK) == 384
    assert bench.whole_blocks(384, 384, BLOCK) == 256  # never the last prompt token


PAIRS = [(c, i) for c in bench.CLIENTS for i in range(1, len(session(c)))]
# Claude Code's first request is [system][user][system: "# Environment" ...]: a system turn
# (~2,110 tokens) after the first user turn, and every later request has tool calls and results
# after its latest user turn; the note with the moved billing-header line goes at the very end,
# so only it (and the generation prompt) is not repeated.
TAIL = 64  # tokens: the note and the generation prompt


@pytest.mark.parametrize(("client", "i"), PAIRS)
def test_the_next_normalized_prompt_repeats_all_but_the_tail_of_the_previous(client: str, i: int) -> None:
    """Request i+1's normalized prompt repeats request i's but its tail: the moved-lines note
    and the generation prompt."""
    prev, cur = normalized(client)[i - 1], normalized(client)[i]
    assert bench.common_prefix(prev, cur) >= len(prev) - TAIL
