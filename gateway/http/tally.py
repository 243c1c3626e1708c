"""What a job's engine output added up to, for the surfaces that read one choice (Responses,
Messages): prompt and output tokens, what the prefix cache held and what it keeps, and how
the engine finished. Each surface writes it in its own usage shape.

The token counts are the job's meter's (gateway/lifecycle/generate.py counts them; the quota
is settled with them), read as each chunk is handled: an answer cut short shows what it had
carried by then."""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.base import EngineChunk
from gateway.job import Job, Meter
from policies import prefix


@dataclass
class Tally:
    meter: Meter
    prompt_tokens: int
    cacheable_tokens: int  # the prompt's whole blocks: what the prefix cache keeps of it
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string (or token id) that ended it

    @classmethod
    def of(cls, job: Job) -> Tally:
        prompt = len(job.prompts[0])
        served = job.served
        cacheable = prefix.cacheable_tokens(prompt, served.engine.kv_spec.block_size)
        return cls(job.meter, prompt, cacheable if served.settings.enable_prefix_caching else 0)

    def observe(self, chunk: EngineChunk) -> None:
        """A chunk is handled (the meter has counted it already)."""
        self.cached_tokens, self.output_tokens = self.meter.cached_tokens, self.meter.completion_tokens
        for c in chunk.choices:
            if c.finish_reason is not None:
                self.finish_reason, self.stop_reason = c.finish_reason, c.stop_reason

    @property
    def written_tokens(self) -> int:
        """Prompt tokens newly kept by the prefix cache (whole blocks it did not hold)."""
        return max(0, self.cacheable_tokens - self.cached_tokens)
