"""One request's life, top to bottom, for every API surface (chat, completions, Responses,
Messages): `prepare` turns the API request into a `Job` and takes no hold on anything; `run`
takes the job's holds in order, produces the answer, and gives every hold back exactly once.

    prepare.prepare_chat / prepare_completion   validate, normalize, tokenize once, route, budget
    run.start -> Running                        quota hold, routing's flight, admission
    Running.body() / Running.events()           engine -> answer in the surface's encoding; release once

Nothing here knows HTTP: an API surface passes its encoders (gateway/http/openai/output.py for
OpenAI's chat and completions) and a function that returns when its client disconnects.
"""

from gateway.job import Job, Meter
from gateway.lifecycle.prepare import NO_ROUTING, Routing, count_chat, prepare_chat, prepare_completion
from gateway.lifecycle.run import ClientLeft, Running, start

__all__ = [
    "NO_ROUTING",
    "ClientLeft",
    "Job",
    "Meter",
    "Routing",
    "Running",
    "count_chat",
    "prepare_chat",
    "prepare_completion",
    "start",
]
