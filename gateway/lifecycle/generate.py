"""A job's engine streams: merged across its prompts, metered, and aborted when closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from engine_adapter.base import EngineChunk, EngineRequest
from gateway.errors import EngineUnavailableError
from gateway.job import Job, Meter
from policies.lanes import Flight


async def _checked(
    stream: AsyncIterator[EngineChunk],
    meter: Meter,
    prompt_tokens: int,
    on_prefill: Callable[[int], None] | None = None,
    flight: Flight | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[EngineChunk]:
    """Engine chunks; an engine-side abort becomes a 503. The meter counts the prompt
    at the first chunk and every output token; `on_prefill` gets the first chunk's
    cached-token count (the prompt is in the engine's cache by then); the flight (routing's
    timing record) sees when each output came."""
    first = True
    meter.sent_prompt_tokens += prompt_tokens  # iterating `stream` sends it to the engine
    async for chunk in stream:
        if first:
            meter.prompt_tokens += prompt_tokens
            meter.cached_tokens += chunk.num_cached_tokens
            first = False
        new = sum(len(c.token_ids) for c in chunk.choices)
        meter.completion_tokens += new
        if new and meter.first_output_at is None:
            meter.first_output_at = time.monotonic()
        if clock is not None and new:
            meter.last_token = clock()
            if meter.first_token is None:
                meter.first_token = meter.last_token
        if flight is not None:
            flight.tokens(new, chunk.num_cached_tokens)
        for c in chunk.choices:
            if c.finish_reason == "abort":  # an error (or the client left: run.py), not a way to finish
                raise EngineUnavailableError("The engine aborted the request.", headers={"Retry-After": "1"})
        meter.finish_reasons += [c.finish_reason for c in chunk.choices if c.finish_reason is not None]
        if on_prefill is not None:
            on_prefill(chunk.num_cached_tokens)
            on_prefill = None
        yield chunk


async def run(
    job: Job,
    *,
    on_prefill: Callable[[int], None] | None = None,
    flight: Flight | None = None,
) -> AsyncGenerator[tuple[int, EngineChunk], None]:
    """All of a job's engine streams, merged: (prompt index, chunk). `on_prefill` and the
    flight see the first prompt's stream (see `_checked`).

    Closing this iterator cancels every engine stream, which aborts their
    engine requests.
    """
    engine = job.served.engine
    if len(job.requests) == 1:
        stream = _checked(
            engine.generate(job.requests[0]), job.meter, len(job.prompts[0]), on_prefill, flight, engine.clock
        )
        async for chunk in stream:
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, EngineChunk] | BaseException | None] = asyncio.Queue()

    async def pump(i: int, request: EngineRequest) -> None:
        try:
            stream = engine.generate(request)
            first = i == 0
            checked = _checked(
                stream,
                job.meter,
                len(job.prompts[i]),
                on_prefill if first else None,
                flight if first else None,
                engine.clock,
            )
            async for chunk in checked:
                await queue.put((i, chunk))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaced to the consumer below
            await queue.put(e)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(job.requests)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def abort(job: Job) -> None:
    """Abort every engine request of the job (finished ones are ignored)."""
    for r in job.requests:
        await job.served.engine.abort(r.request_id)
