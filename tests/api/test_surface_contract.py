"""The surface contract (gateway/http/surface.py, docs/lifecycle.md), pinned with a minimal
fake surface plugged into a real app beside the shipped ones: one folder's worth of code (a
router, a parser, two encoders and one `Surface`) and one entry in `create_app`'s surfaces.

What it must get without writing it: the shared preamble reads its key from its own header;
every error on its paths, before the stream and from the lifecycle, comes in its shape and
status and names its own field; a stream an error cuts short ends with its own event, counts
as failed, and gives back what it held. The replay engine answers (no vLLM); `[[replay:crash]]`
kills it, as an engine whose process died.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from gateway import lifecycle
from gateway.app import SURFACES
from gateway.errors import GatewayError
from gateway.http import json_body
from gateway.http.serving import Encoder, answer, prepared, routing_of
from gateway.http.surface import Surface
from gateway.job import Job
from gateway.lifecycle.requests import ChatCompletionRequest
from gateway.lifecycle.run import Chunks
from tests.configs import EVERY, shipped_config
from tests.conftest import App, in_process

KEY = "sk-sparkgate-dev"  # config/replay.yaml's demo user key
MODEL = "sparkgate-replay"
CAP = 64  # its model's max_output_tokens
CONTEXT = 1024  # and its context

# --- the fake surface: what a new API's folder would hold ------------------------------------

router = APIRouter()


class Ask(BaseModel):
    model: str
    say: str
    limit: int | None = None
    stream: bool = False


def parse(raw: bytes) -> Ask:
    return json_body.validate(Ask, json_body.document(raw))


async def complete(job: Job, chunks: Chunks) -> dict[str, Any]:
    said = [c.text async for _, chunk in chunks for c in chunk.choices]
    return {"said": "".join(said), "tokens": job.meter.completion_tokens}


async def stream(job: Job, chunks: Chunks) -> AsyncIterator[str]:
    yield "begin\n"
    async for _, chunk in chunks:
        for c in chunk.choices:
            yield f"piece {c.text!r}\n"
    yield "end\n"


@router.post("/v1/fake")
async def ask(request: Request) -> Response:
    state, caller, req = await FAKE.read(request, parse, model=lambda r: r.model)
    chat = ChatCompletionRequest.model_validate(
        {"model": req.model, "messages": [{"role": "user", "content": req.say}], "max_tokens": req.limit}
        | {"stream": req.stream}
    )
    routing = routing_of(state, request)
    job = await prepared(FAKE, lifecycle.prepare_chat(chat, state.registry, caller, state.settings.limits, routing))
    return await answer(job, state, request, FAKE, Encoder(complete, stream))


def status(err: GatewayError) -> int:
    return 418 if err.status == 400 else err.status


FAKE = Surface(
    "fake",
    router,
    paths=("/v1/fake",),
    error_status=status,
    error_body=lambda err: {"oops": {"code": err.code, "field": err.param}},
    stream_error=lambda err: f"broke {err.code}\n",
    key_headers=("x-fake-key",),
    params={"max_tokens": "limit", "messages": "say"},
)

# --- the tests -------------------------------------------------------------------------------


@pytest.fixture
def app() -> Iterator[App]:
    """A fresh app per test: the crash test leaves its engine dead."""
    cfg = shipped_config("replay", models={EVERY: {"max_output_tokens": CAP, "max_context": CONTEXT}})
    with in_process(cfg, surfaces=(*SURFACES, FAKE)) as a:
        yield a


def fake(app: App, key: str | None = KEY, **body: Any) -> httpx.Response:
    headers = {} if key is None else {"x-fake-key": key}
    return app.http.post("/v1/fake", json={"model": MODEL, "say": "hi", **body}, headers=headers)


def counters(app: App) -> dict[str, Any]:
    return app.stats(KEY)


def test_a_fake_surface_answers_through_the_lifecycle(app: App) -> None:
    r = fake(app, limit=5)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == 5 and r.json()["said"]  # the job's meter: the one count
    assert r.headers["X-Sparkgate-Model"] == MODEL  # what serving adds to every surface's answer
    streamed = fake(app, limit=3, stream=True)
    lines = streamed.text.splitlines()
    assert lines[0] == "begin" and lines[-1] == "end" and len(lines) == 5
    # The shipped surfaces still answer beside it.
    chat = app.sdk(KEY).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.usage is not None and chat.usage.completion_tokens == 2


def test_the_key_comes_from_its_own_header(app: App) -> None:
    assert fake(app, key=None).json() == {"oops": {"code": "missing_api_key", "field": None}}
    assert fake(app, key="sk-wrong").json() == {"oops": {"code": "invalid_api_key", "field": None}}
    other = app.http.post("/v1/fake", json={"model": MODEL, "say": "hi"}, headers={"Authorization": f"Bearer {KEY}"})
    assert other.status_code == 401  # not a header this API sends its key in


def test_errors_come_in_its_shape_and_name_its_fields(app: App) -> None:
    bad_json = app.http.post("/v1/fake", content=b"{", headers={"x-fake-key": KEY, "content-type": "application/json"})
    assert (bad_json.status_code, bad_json.json()["oops"]["code"]) == (418, "invalid_json")
    missing = fake(app, say=None)
    assert (missing.status_code, missing.json()["oops"]["field"]) == (418, "say")
    # The lifecycle's refusals name chat's fields (max_tokens, messages): named as this API names them.
    over_cap = fake(app, limit=CAP + 1)
    assert over_cap.status_code == 418 and over_cap.json()["oops"]["field"] == "limit", over_cap.text
    too_long = fake(app, say="hi " * CONTEXT, limit=CAP)
    assert too_long.json() == {"oops": {"code": "context_length_exceeded", "field": "say"}}
    unknown = fake(app, model="nope")
    assert unknown.json() == {"oops": {"code": "model_not_found", "field": "model"}} and unknown.status_code == 404
    gone = app.http.post("/v1/fake/nowhere", headers={"x-fake-key": KEY})
    assert gone.status_code == 404 and gone.json()["oops"]["code"] == "not_found"  # its paths, before routing


def test_a_stream_cut_by_an_error_ends_with_its_event_and_counts_as_failed(app: App) -> None:
    before = counters(app)
    r = fake(app, say="[[replay:crash]]", limit=5, stream=True)
    assert r.status_code == 200  # the status line went before the engine failed
    assert r.text.splitlines() == ["begin", "broke engine_unavailable"]
    after = counters(app)
    assert after["failed"] == before["failed"] + 1 and after["completed"] == before["completed"]
    assert after["admission"]["released"] == after["admission"]["admitted"]  # its ticket went back
    pools = [e["admission"] for e in after["engines"].values()]
    assert all(p["admitted"] == 0 and p["used_blocks"] == 0 for p in pools), pools
    assert after["quota"] == before["quota"] or after["quota"].get("in_flight", 0) == 0
