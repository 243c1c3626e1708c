"""A job's engine streams: merged across its prompts, metered, and aborted when closed.

The job's `Meter` is the one count of its tokens: the quota is settled with it, and the
encoders show their usage from it (they count none themselves). So it counts each chunk as the
chunk is handed on, in the order the encoders get them: whenever an encoder reads the meter,
it holds the chunks that encoder has had, the one in hand included, and no others (a stream's
usage so far, `continuous_usage_stats`, is then what its frames carried). What the engine's
own timing tells (when output came, when the prefill ended) is noted as chunks arrive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from engine_adapter.base import EngineChunk, EngineRequest
from gateway.errors import EngineUnavailableError
from gateway.job import Job, Meter
from policies.lanes import Flight

log = logging.getLogger(__name__)


def _new_tokens(chunk: EngineChunk) -> int:
    return sum(len(c.token_ids) for c in chunk.choices)


def _aborted(chunk: EngineChunk) -> bool:
    # An error (or the client left: run.py), not a way to finish.
    return any(c.finish_reason == "abort" for c in chunk.choices)


class _Count:
    """Counts a job's chunks into its meter, as they are handed on (see the module's doc)."""

    def __init__(self, job: Job) -> None:
        self.meter = job.meter
        self.lengths = [len(p) for p in job.prompts]
        self.cached: list[int | None] = [None] * len(self.lengths)  # per prompt, once its output came

    def __call__(self, prompt_index: int, chunk: EngineChunk, *, check: bool = True) -> None:
        """Count a chunk of the prompt: the prompt at its first (it is prefilled by then), the
        cached tokens, every output token, the finish reasons. `check`: an engine-side abort
        becomes a 503, once its tokens are counted."""
        m = self.meter
        cached = self.cached[prompt_index]
        if cached is None:
            counted = self.lengths[prompt_index]
            m.prompt_tokens += counted
            cached = 0
            if chunk.prompt_tokens and chunk.prompt_tokens != counted:
                # The bill, the KV reservation and the context check all used the gateway's count.
                log.warning(
                    "prompt %d: the engine counted %d tokens, the gateway %d",
                    prompt_index,
                    chunk.prompt_tokens,
                    counted,
                )
        # The most any chunk of the prompt reported: a vLLM server reports it on its last chunk
        # only, and a simulated request admitted again after a preemption anew.
        if chunk.num_cached_tokens > cached:
            m.cached_tokens += chunk.num_cached_tokens - cached
            cached = chunk.num_cached_tokens
        self.cached[prompt_index] = cached
        m.completion_tokens += _new_tokens(chunk)
        if _aborted(chunk):
            if check:
                raise EngineUnavailableError("The engine aborted the request.", headers={"Retry-After": "1"})
            return
        m.finish_reasons += [c.finish_reason for c in chunk.choices if c.finish_reason is not None]


async def _received(
    stream: AsyncIterator[EngineChunk],
    meter: Meter,
    prompt_tokens: int,
    on_prefill: Callable[[int], None] | None = None,
    flight: Flight | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[EngineChunk]:
    """A prompt's engine chunks as they arrive, up to an aborted one (`_Count` raises it). The
    meter notes when the prompt was sent and when output came; `on_prefill` gets the first
    chunk's cached-token count (the prompt is in the engine's cache by then); the flight
    (routing's timing record) sees when each output came."""
    meter.sent_prompt_tokens += prompt_tokens  # iterating `stream` sends it to the engine
    async for chunk in stream:
        new = _new_tokens(chunk)
        if new and meter.first_output_at is None:
            meter.first_output_at = time.monotonic()
        if clock is not None and new:
            meter.last_token = clock()
            if meter.first_token is None:
                meter.first_token = meter.last_token
        if flight is not None:
            flight.tokens(new, chunk.num_cached_tokens)
        aborted = _aborted(chunk)
        if on_prefill is not None and not aborted:
            on_prefill(chunk.num_cached_tokens)
            on_prefill = None
        yield chunk
        if aborted:
            return


async def metered(
    job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]
) -> AsyncGenerator[tuple[int, EngineChunk], None]:
    """A job's merged chunks, (prompt index, chunk), counted into its meter as `run` counts
    them: for chunks that come from elsewhere (a test's), so that the encoders read their usage
    from the meter as they do when serving."""
    count = _Count(job)
    async for i, chunk in chunks:
        count(i, chunk)
        yield i, chunk


async def run(
    job: Job,
    *,
    on_prefill: Callable[[int], None] | None = None,
    flight: Flight | None = None,
) -> AsyncGenerator[tuple[int, EngineChunk], None]:
    """All of a job's engine streams, merged and metered: (prompt index, chunk); an
    engine-side abort becomes a 503. `on_prefill` and the flight see the first prompt's
    stream (see `_received`).

    Closing this iterator cancels every engine stream, which aborts their
    engine requests.
    """
    engine = job.served.engine
    count = _Count(job)
    if len(job.requests) == 1:
        stream = _received(
            engine.generate(job.requests[0]), job.meter, len(job.prompts[0]), on_prefill, flight, engine.clock
        )
        async for chunk in stream:
            count(0, chunk)
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, EngineChunk] | BaseException | None] = asyncio.Queue()

    async def pump(i: int, request: EngineRequest) -> None:
        try:
            stream = engine.generate(request)
            first = i == 0
            received = _received(
                stream,
                job.meter,
                len(job.prompts[i]),
                on_prefill if first else None,
                flight if first else None,
                engine.clock,
            )
            async for chunk in received:
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
                count(*item)
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Chunks that came but were never handed on: the engine did that work all the same.
        while not queue.empty():
            item = queue.get_nowait()
            if isinstance(item, tuple):
                count(*item, check=False)


async def abort(job: Job) -> None:
    """Abort every engine request of the job (finished ones are ignored)."""
    for r in job.requests:
        await job.served.engine.abort(r.request_id)
