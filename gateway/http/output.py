"""A job's engine output as OpenAI answers: one JSON body, or server-sent events.

Streams: `data: {chunk}\\n\\n` lines, a usage-only final chunk when
`stream_options.include_usage` is set, then `data: [DONE]`. An error after
the stream started is sent as an `error` event (the status line is gone).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from engine_adapter.base import EngineChunk
from gateway.errors import from_exception
from gateway.http import bodies
from gateway.http.bodies import ChoiceState, CompletionLogprobs, Usage
from gateway.lifecycle.job import Job

log = logging.getLogger(__name__)


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


class _Accounting:
    """Usage across a job's prompts (prompt tokens once per prompt, not per
    choice), and what an echo needs: the prompt's logprobs arrive once per
    prompt, while each of its n choices echoes them."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.cached = [0] * len(job.prompts)
        self.prompt_logprobs: list[tuple[Any, ...] | None] = [None] * len(job.prompts)
        self.usage = Usage(prompt_tokens=sum(len(p) for p in job.prompts))
        self._token_texts: dict[int, list[str]] = {}

    def observe(self, prompt_index: int, chunk: EngineChunk) -> None:
        self.cached[prompt_index] = max(self.cached[prompt_index], chunk.num_cached_tokens)
        self.usage.completion_tokens += sum(len(c.token_ids) for c in chunk.choices)
        self.usage.cached_tokens = sum(self.cached)
        if chunk.prompt_logprobs and self.prompt_logprobs[prompt_index] is None:
            self.prompt_logprobs[prompt_index] = chunk.prompt_logprobs

    def echo(self, prompt_index: int, lp: CompletionLogprobs) -> str:
        """The prompt text to prepend; adds the prompt's logprobs to `lp`."""
        prompt = self.job.prompts[prompt_index]
        if self.job.logprobs is not None:
            lps = self.prompt_logprobs[prompt_index] or (None,) * len(prompt)
            lp.add(list(lps), self._prompt_token_texts(prompt_index))
        return prompt.text

    def _prompt_token_texts(self, prompt_index: int) -> list[str]:
        """Each prompt token as text, decoded once per prompt (not once per choice)."""
        if prompt_index not in self._token_texts:
            tok = self.job.served.tokenizer
            ids = self.job.prompts[prompt_index].token_ids
            self._token_texts[prompt_index] = [tok.decode([t], skip_special_tokens=False) for t in ids]
        return self._token_texts[prompt_index]


def _choice_index(job: Job, prompt_index: int, index: int) -> int:
    return prompt_index * job.n + index


def _token_texts(token_lps: Any) -> list[str]:
    return [lp.token if lp is not None else "" for lp in token_lps]


async def complete(job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> dict[str, Any]:
    """The whole (non-streaming) response body from the job's merged engine chunks."""
    acct = _Accounting(job)
    states: dict[int, ChoiceState] = {}
    legacy: dict[int, CompletionLogprobs] = {}
    async for i, chunk in chunks:
        acct.observe(i, chunk)
        for c in chunk.choices:
            idx = _choice_index(job, i, c.index)
            lp = legacy.setdefault(idx, CompletionLogprobs(job.logprobs or 0))
            state = states.get(idx)
            if state is None:
                state = states[idx] = ChoiceState(index=idx)
                if job.kind == "completion" and job.echo:
                    state.text = acct.echo(i, lp)
            state.add(c)
            if job.kind == "completion" and job.logprobs is not None and c.logprobs:
                lp.add(list(c.logprobs), _token_texts(c.logprobs))
    choices = [states[k] for k in sorted(states)]
    model = job.served.name
    if job.kind == "chat":
        return bodies.chat_completion(
            id=job.id,
            created=job.created,
            model=model,
            choices=choices,
            usage=acct.usage,
            top_logprobs=job.logprobs,
        )
    return bodies.envelope(
        "text_completion",
        id=job.id,
        created=job.created,
        model=model,
        choices=[
            {
                "index": c.index,
                "text": c.text,
                "logprobs": legacy[c.index].body() if job.logprobs is not None else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        usage=acct.usage,
    )


async def stream(job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> AsyncIterator[str]:
    """The job's merged engine chunks as SSE lines."""
    acct = _Accounting(job)
    started: set[int] = set()
    legacy: dict[int, CompletionLogprobs] = {}
    object_name = "chat.completion.chunk" if job.kind == "chat" else "text_completion"

    def frame(choices: list[dict[str, Any]], usage: Usage | None = None) -> str:
        return sse(
            bodies.envelope(
                object_name,
                id=job.id,
                created=job.created,
                model=job.served.name,
                choices=choices,
                usage=usage,
                with_usage_field=job.include_usage,
            )
        )

    try:
        async for i, chunk in chunks:
            acct.observe(i, chunk)
            out: list[dict[str, Any]] = []
            for c in chunk.choices:
                idx = _choice_index(job, i, c.index)
                if job.kind == "chat":
                    if idx not in started:
                        started.add(idx)
                        role = {"role": "assistant", "content": ""}
                        yield frame([{"index": idx, "delta": role, "logprobs": None, "finish_reason": None}])
                    if not c.text and c.finish_reason is None and not c.logprobs:
                        continue
                    out.append(
                        {
                            "index": idx,
                            "delta": {"content": c.text} if c.text else {},
                            "logprobs": bodies.chat_logprobs(c.logprobs or (), job.logprobs)
                            if job.logprobs is not None
                            else None,
                            "finish_reason": c.finish_reason,
                        }
                    )
                else:
                    text = c.text
                    lp = legacy.setdefault(idx, CompletionLogprobs(job.logprobs or 0))
                    if idx not in started:
                        started.add(idx)
                        if job.echo:
                            text = acct.echo(i, lp) + text
                    if job.logprobs is not None and c.logprobs:
                        lp.add(list(c.logprobs), _token_texts(c.logprobs))
                    if not text and c.finish_reason is None:
                        continue
                    out.append(
                        {
                            "index": idx,
                            "text": text,
                            "logprobs": lp.take() if job.logprobs is not None else None,
                            "finish_reason": c.finish_reason,
                        }
                    )
            if out:
                yield frame(out)
        if job.include_usage:
            yield frame([], acct.usage)
    except Exception as exc:  # the status line is sent: report in-band
        err = from_exception(exc)
        log.warning("stream %s failed: %s", job.id, err.message)
        yield sse(err.body())
    yield sse("[DONE]")
