"""A job's engine output as OpenAI answers: one JSON body, or server-sent events.

Streams: `data: {chunk}\\n\\n` lines, one choice per chunk, a usage-only final chunk when
`stream_options.include_usage` is set, then `data: [DONE]`. An error after the stream
started is let through: the lifecycle ends the stream with the surface's error event
(gateway/http/surface.py `openai_stream_error`; the status line is gone).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from engine_adapter.base import EngineChunk
from gateway.http.openai import bodies
from gateway.http.openai.bodies import ChoiceState, CompletionLogprobs, Usage, tool_call
from gateway.http.sse import sse
from gateway.job import Job
from gateway.text import assistant
from gateway.text.assistant import ContentDelta, Event, ReasoningDelta, ToolCallArgs, ToolCallStart, TurnParser
from policies import tokens


class _Accounting:
    """Usage across a job's prompts (prompt tokens once per prompt, not per
    choice), and what an echo needs: the prompt's logprobs arrive once per
    prompt, while each of its n choices echoes them.

    The output and cached tokens are the job's meter's (gateway/lifecycle/generate.py counts
    them, the quota is settled with them), read as each chunk is handled."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.prompt_logprobs: list[tuple[Any, ...] | None] = [None] * len(job.prompts)
        self.usage = Usage(prompt_tokens=sum(len(p) for p in job.prompts))
        self._token_texts: dict[int, list[str]] = {}
        self._texts: dict[int, str] = {}

    def observe(self, prompt_index: int, chunk: EngineChunk) -> None:
        """A chunk is handled (the meter has counted it already)."""
        meter = self.job.meter
        self.usage.completion_tokens, self.usage.cached_tokens = meter.completion_tokens, meter.cached_tokens
        if chunk.prompt_logprobs and self.prompt_logprobs[prompt_index] is None:
            self.prompt_logprobs[prompt_index] = chunk.prompt_logprobs

    def prompt_logprobs_body(self, prompt_index: int) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's `prompt_logprobs` of a prompt, when the client asked them."""
        if self.job.prompt_logprobs is None:
            return None
        lps = self.prompt_logprobs[prompt_index]
        return bodies.prompt_logprobs(lps, len(self.job.prompts[prompt_index]), self.job.prompt_logprobs)

    def echo(self, prompt_index: int, lp: CompletionLogprobs) -> str:
        """The prompt text to prepend; adds the prompt's logprobs to `lp`."""
        prompt = self.job.prompts[prompt_index]
        if self.job.logprobs is not None:
            lps = self.prompt_logprobs[prompt_index] or (None,) * len(prompt)
            lp.add(list(lps), self._prompt_token_texts(prompt_index))
        if prompt_index not in self._texts:  # an id prompt is decoded here, once, and only for echo
            self._texts[prompt_index] = tokens.text_of(self.job.served.tokenizer, prompt)
        return self._texts[prompt_index]

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
    parsers: dict[int, TurnParser] = {}
    turns: dict[int, assistant.Turn] = {}
    async for i, chunk in chunks:
        acct.observe(i, chunk)
        for c in chunk.choices:
            idx = _choice_index(job, i, c.index)
            lp = legacy.setdefault(idx, CompletionLogprobs(job.logprobs or 0))
            state = states.get(idx)
            if state is None:
                state = states[idx] = ChoiceState(index=idx)
                parsers[idx], turns[idx] = TurnParser(job.turn), assistant.Turn()
                if job.kind == "completion" and job.echo:
                    state.text = acct.echo(i, lp)
            state.add(c)
            if job.kind == "chat":
                turns[idx].apply(parsers[idx].feed(c.text, c.token_ids))
            if job.kind == "completion" and job.logprobs is not None and c.logprobs:
                lp.add(list(c.logprobs), _token_texts(c.logprobs))
    choices = [states[k] for k in sorted(states)]
    model = job.served.name
    if job.kind == "chat":
        for idx, parser in parsers.items():
            turns[idx].apply(parser.finish())
        acct.usage.reasoning_tokens = job.meter.reasoning_tokens = sum(p.reasoning_tokens for p in parsers.values())
        return bodies.chat_completion(
            id=job.id,
            created=job.created,
            model=model,
            choices=[
                (c, turns[c.index], assistant.finish_reason(c.finish_reason, parsers[c.index].calls)) for c in choices
            ],
            usage=acct.usage,
            top_logprobs=job.logprobs,
            forced=job.turn.forced is not None,
            extras=bodies.Extras(
                echo=job.echo_text,
                prompt_logprobs=acct.prompt_logprobs_body(0),
                prompt_token_ids=list(job.prompts[0].token_ids) if job.return_token_ids else None,
            ),
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
            | _completion_extras(job, acct, c.index // job.n, c.token_ids, whole=True)
            for c in choices
        ],
        usage=acct.usage,
    )


def _completion_extras(
    job: Job, acct: _Accounting, prompt_index: int, token_ids: list[int] | tuple[int, ...], *, whole: bool
) -> dict[str, Any]:
    """vLLM's fields of a completion choice: its prompt's logprobs and ids (`whole`: in a body,
    or a stream's first chunk of the choice) and its own new ids."""
    extras: dict[str, Any] = {}
    if whole and not job.stream:  # vLLM streams none; a body has it, null when not asked
        extras["prompt_logprobs"] = acct.prompt_logprobs_body(prompt_index)
    if job.return_token_ids:
        if whole:
            extras["prompt_token_ids"] = list(job.prompts[prompt_index].token_ids)
        extras["token_ids"] = list(token_ids)
    return extras


def chat_deltas(events: list[Event]) -> list[dict[str, Any]]:
    """A choice's parsed output as chat deltas: text of one kind merged, each tool call's
    id and name once, then its arguments in pieces."""
    deltas: list[dict[str, Any]] = []
    for e in events:
        if isinstance(e, ReasoningDelta | ContentDelta):
            keys = ("reasoning_content", "reasoning") if isinstance(e, ReasoningDelta) else ("content",)
            if deltas and set(deltas[-1]) == set(keys):
                for k in keys:
                    deltas[-1][k] += e.text
            else:
                deltas.append(dict.fromkeys(keys, e.text))
        elif isinstance(e, ToolCallStart):
            deltas.append({"tool_calls": [tool_call(e.index, e.id, e.name, "")]})
        elif isinstance(e, ToolCallArgs):
            deltas.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.delta}}]})
    return deltas


async def stream(job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> AsyncIterator[str]:
    """The job's merged engine chunks as SSE lines. An engine chunk's frames go out together,
    and the last chunk's with the usage and `[DONE]`: each piece yielded is a write (a syscall
    and a trip down the middleware's send chain), and a 1-token chat was five of them."""
    acct = _Accounting(job)
    started: set[int] = set()
    parsers: dict[int, TurnParser] = {}
    legacy: dict[int, CompletionLogprobs] = {}
    object_name = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    unfinished = len(job.requests)  # engine requests whose last chunk has not come
    tail: list[str] = []  # the last chunk's frames, held for the answer's end

    def frame(choices: list[dict[str, Any]], usage: Usage | None = None, top: dict[str, Any] | None = None) -> str:
        body = bodies.envelope(
            object_name,
            id=job.id,
            created=job.created,
            model=job.served.name,
            choices=choices,
            usage=usage or (acct.usage if job.continuous_usage else None),
            with_usage_field=job.include_usage,
        )
        return sse(body | top if top else body)

    async for i, chunk in chunks:
        shown = acct.usage.completion_tokens  # the count the frames so far carried (the meter's, before this chunk)
        acct.observe(i, chunk)
        frames: list[str] = []
        out: list[dict[str, Any]] = []
        for c in chunk.choices:
            idx = _choice_index(job, i, c.index)
            if job.kind == "chat":
                if idx not in started:
                    started.add(idx)
                    parsers[idx] = TurnParser(job.turn)
                    role = {"role": "assistant", "content": ""}
                    ids = {"prompt_token_ids": list(job.prompts[0].token_ids)} if job.return_token_ids else {}
                    # The usage so far leaves out the tokens of the text that follows these
                    # frames, as vLLM counts: each chunk's count then grows.
                    before = replace(acct.usage, completion_tokens=shown) if job.continuous_usage else None
                    frames.append(
                        frame(
                            [{"index": idx, "delta": role, "logprobs": None, "finish_reason": None}],
                            before,
                            top=ids,
                        )
                    )
                    if job.echo_text:
                        echoed = {"index": idx, "delta": {"content": job.echo_text}}
                        frames.append(frame([echoed | {"logprobs": None, "finish_reason": None}], before))
                shown += len(c.token_ids)
                parser = parsers[idx]
                events = parser.feed(c.text, c.token_ids)
                if c.finish_reason is not None:
                    events += parser.finish()
                deltas = chat_deltas(events)
                if not deltas and c.finish_reason is None and not c.logprobs and not job.return_token_ids:
                    continue
                logprobs = bodies.chat_logprobs(c.logprobs or (), job.logprobs) if job.logprobs is not None else None
                finish = assistant.finish_reason(c.finish_reason, parser.calls)
                for k, delta in enumerate(deltas or [{}]):
                    last = k == max(len(deltas), 1) - 1
                    entry = {"index": idx, "delta": delta, "logprobs": logprobs if k == 0 else None}
                    entry["finish_reason"] = finish if last else None
                    if job.return_token_ids:  # the engine chunk's ids, on its first frame
                        entry["token_ids"] = list(c.token_ids) if k == 0 else []
                    if last:
                        out.append(entry)
                    else:
                        frames.append(frame([entry]))
            else:
                text = c.text
                lp = legacy.setdefault(idx, CompletionLogprobs(job.logprobs or 0))
                first = idx not in started
                if first:
                    started.add(idx)
                    if job.echo:
                        text = acct.echo(i, lp) + text
                if job.logprobs is not None and c.logprobs:
                    lp.add(list(c.logprobs), _token_texts(c.logprobs))
                if not text and c.finish_reason is None and not job.return_token_ids:
                    continue
                out.append(
                    {
                        "index": idx,
                        "text": text,
                        "logprobs": lp.take() if job.logprobs is not None else None,
                        "finish_reason": c.finish_reason,
                    }
                    | _completion_extras(job, acct, i, c.token_ids, whole=first)
                )
        # One choice per chunk, as OpenAI and vLLM send them: a client that reads
        # `choices[0]` of each chunk sees every choice's text and finish reason.
        frames += [frame([entry]) for entry in out]
        unfinished -= chunk.finished
        if unfinished > 0:
            if frames:
                yield "".join(frames)
        else:  # nothing is left to wait for: these go out with the end
            tail += frames
    acct.usage.reasoning_tokens = job.meter.reasoning_tokens = sum(p.reasoning_tokens for p in parsers.values())
    if job.include_usage:
        tail.append(frame([], acct.usage))
    tail.append(sse("[DONE]"))
    yield "".join(tail)
