"""Engine output -> OpenAI response bodies (chat and completions, whole and chunked).

`ChoiceState` accumulates one choice across engine chunks; the builders turn
states into the exact JSON shapes OpenAI clients parse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.base import ChoiceDelta, TokenLogprob
from gateway.text.assistant import Turn

# OpenAI's spec has a string here (what backend served it); clients that check types reject null.
SYSTEM_FINGERPRINT = "fp_sparkgate"


# vLLM's server floor for a logprob JSON cannot carry: -inf is a token a structured output's
# grammar (or a -100 bias) masked, and a body holding it fails to encode (a 500).
LOGPROB_FLOOR = -9999.0


def finite(logprob: float) -> float:
    """The logprob as JSON can carry it: -inf and NaN at vLLM's floor (+inf, never a log of a
    probability, as 0)."""
    if LOGPROB_FLOOR < logprob < math.inf:
        return logprob
    return 0.0 if logprob == math.inf else LOGPROB_FLOOR


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(lps: tuple[TokenLogprob, ...] | list[TokenLogprob], top_k: int) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": finite(lp.logprob),
                "bytes": _bytes(lp.token),
                "top_logprobs": [{"token": t, "logprob": finite(v), "bytes": _bytes(t)} for _, t, v in lp.top[:top_k]],
            }
            for lp in lps
        ],
        "refusal": None,
    }


def prompt_logprobs(
    lps: tuple[TokenLogprob | None, ...] | None, length: int, top_k: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: per prompt token, None for the first (nothing precedes it),
    else {token id: {logprob, rank, decoded_token}} for the prompt's token and the top k."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps or (None,) * length:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": lp.token}}
        for rank, (token_id, token, logprob) in enumerate(lp.top[:top_k], start=1):
            entry.setdefault(str(token_id), {"logprob": finite(logprob), "rank": rank, "decoded_token": token})
        out.append(entry)
    return out


@dataclass
class CompletionLogprobs:
    """Legacy completions logprobs, with text offsets running across chunks."""

    top_k: int
    offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, lps: tuple[TokenLogprob | None, ...] | list[TokenLogprob | None], tokens: list[str]) -> None:
        for lp, text in zip(lps, tokens, strict=True):
            self.tokens.append(text)
            self.text_offset.append(self.offset)
            self.offset += len(text)
            if lp is None:
                self.token_logprobs.append(None)
                self.top_logprobs.append(None)
            else:
                logprob = finite(lp.logprob)
                self.token_logprobs.append(logprob)
                # The sampled token first, then the top k (as vLLM answers: `logprobs: 0` gives
                # the sampled token alone, and one outside the top k makes k + 1 entries).
                top = {text: logprob}
                for _, t, v in lp.top[: self.top_k]:
                    top.setdefault(t, finite(v))
                self.top_logprobs.append(top)

    def body(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }

    def take(self) -> dict[str, Any]:
        """The entries added since the last take (for streaming), then reset them."""
        body = self.body()
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return body


@dataclass
class ChoiceState:
    index: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    def add(self, d: ChoiceDelta) -> None:
        self.text += d.text
        self.completion_tokens += len(d.token_ids)
        self.token_ids += d.token_ids
        if d.logprobs:
            self.logprobs.extend(d.logprobs)
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of the completion tokens, those inside think blocks

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }


def tool_call(index: int | None, id: str, name: str, arguments: str) -> dict[str, Any]:
    call: dict[str, Any] = {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return call if index is None else {"index": index, **call}


def chat_message(turn: Turn, echo: str = "", *, forced: bool = False) -> dict[str, Any]:
    """The assistant message: the answer (after the echoed text, for vLLM's `echo`), the
    reasoning under both names clients read (`reasoning_content`, vLLM's older; `reasoning`,
    its newer), the tool calls. A forced call the token limit cut (`forced`, no call) has
    `tool_calls: null`, as vLLM answers it: a client that forced a call tests for None."""
    content = echo + turn.content
    calls = [tool_call(None, c.id, c.name, c.arguments) for c in turn.tool_calls]
    message: dict[str, Any] = {
        "role": "assistant",
        # OpenAI sends null content beside tool calls when there is no text.
        "content": content if content or not turn.tool_calls else None,
        "refusal": None,
        "tool_calls": calls or (None if forced else []),
    }
    if turn.saw_reasoning:
        message["reasoning_content"] = message["reasoning"] = turn.reasoning
    return message


def chat_completion(
    *,
    id: str,
    created: int,
    model: str,
    choices: list[tuple[ChoiceState, Turn, str | None]],
    usage: Usage,
    top_logprobs: int | None,
    extras: Extras | None = None,
    forced: bool = False,
) -> dict[str, Any]:
    """`choices`: each choice's state, its parsed turn and its finish reason; `forced`: the
    request forced a tool call."""
    x = extras or Extras()
    body = {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": chat_message(turn, x.echo, forced=forced),
                "logprobs": chat_logprobs(c.logprobs, top_logprobs) if top_logprobs is not None else None,
                "finish_reason": finish,
            }
            | ({"token_ids": c.token_ids} if x.prompt_token_ids is not None else {})
            for c, turn, finish in choices
        ],
        "usage": usage.body(),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    # Null when not asked, as vLLM answers: its clients read the field either way.
    body["prompt_logprobs"] = x.prompt_logprobs
    if x.prompt_token_ids is not None:
        body["prompt_token_ids"] = x.prompt_token_ids
    return body


@dataclass(frozen=True)
class Extras:
    """What vLLM's extensions add to a chat body: the echoed text, the prompt's logprobs, and
    (`return_token_ids`) the prompt's ids at the top and each choice's own."""

    echo: str = ""
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None


def envelope(
    object_name: str,
    *,
    id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: Usage | None = None,
    with_usage_field: bool = False,
) -> dict[str, Any]:
    """A completions body or a chunk of either API: they differ only in `object`.
    `usage: null` appears on chunks only when the client asked for usage."""
    body: dict[str, Any] = {
        "id": id,
        "object": object_name,
        "created": created,
        "model": model,
        "choices": choices,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    if usage is not None:
        body["usage"] = usage.body()
    elif with_usage_field:
        body["usage"] = None
    return body
