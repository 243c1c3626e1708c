"""gateway/router.py: served models as the load model's lanes, each request's SLO class and
candidates, and the HTTP errors for a request no model can take."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import cast

import pytest

from engine_adapter.base import Engine, KVGroup, KVSpec
from gateway.auth import ANONYMOUS, Principal
from gateway.errors import EngineUnavailableError, InvalidRequest, SloUnattainable
from gateway.job import Job
from gateway.lifecycle.run import _route_hold, _start_flight
from gateway.registry import ServedModel
from gateway.router import Router
from gateway.settings import KeyLimits, LatencyProfile, ModelSettings, RoutingSettings, SloClass
from policies import tokens
from policies.load import RouteInfo, RouteQuery

SPEC = KVSpec(
    block_size=16,
    num_blocks=1001,
    bytes_per_block=4096,
    kv_cache_bytes=1001 * 4096,
    cache_dtype="bfloat16",
    groups=(KVGroup(kind="full_attention", num_layers=2, block_size=16, page_bytes_per_layer=2048),),
    max_model_len=65_536,
    prefix_caching=True,
    max_num_seqs=8,
    max_num_batched_tokens=4096,
    long_prefill_token_threshold=1024,
)
ROUTING = RoutingSettings(
    enabled=True,
    classes={"interactive": SloClass(ttft_s=2.0, tpot_s=0.06), "batch": SloClass(deadline_s=600.0, prefer="fast")},
)


class StubEngine:
    """What the router reads of an engine."""

    def __init__(self, spec: KVSpec) -> None:
        self.kv_spec = spec
        self.is_healthy = True
        self.now = 0.0

    def clock(self) -> float:
        return self.now


def served(name: str, quality: float, engine: StubEngine, **kw: object) -> ServedModel:
    settings = ModelSettings(
        name=name, path=f"/models/{name}", quality=quality, latency=LatencyProfile(prefill_tokens_per_s=3000), **kw
    )
    return ServedModel(settings=settings, engine=cast(Engine, engine), tokenizer=None)


def query(requested: str, candidates: list[str], prompt: int, slo: str = "interactive") -> RouteQuery:
    return RouteQuery(
        requested=requested, candidates=candidates, slo_class=slo, prompt_ids=range(prompt), output_tokens=100
    )


@pytest.fixture
def engines() -> tuple[StubEngine, StubEngine]:
    return StubEngine(SPEC), StubEngine(dataclasses.replace(SPEC, prefix_caching=False))


@pytest.fixture
def router(engines: tuple[StubEngine, StubEngine]) -> Router:
    small, big = engines
    models = [served("small", 10, small), served("big", 30, big, aliases=("large",), max_concurrency=2)]
    return Router(ROUTING, models, {"small": "spark-1", "big": "spark-1"})


def test_served_models_become_lanes_best_first(router: Router, engines: tuple[StubEngine, StubEngine]) -> None:
    big, small = router.model.lanes["big"], router.model.lanes["small"]
    assert list(router.model.lanes) == ["big", "small"] and big.mates == [small]
    assert (big.slots, big.spec.cache_blocks, big.spec.block_size) == (2, 0, 16)
    assert (small.slots, small.spec.cache_blocks, small.spec.chunk_tokens, small.spec.step_tokens) == (
        8,
        1000,
        1024,
        4096,
    )
    assert not small.spec.aligned_chunks  # full attention only: vLLM splits prefills anywhere
    engines[0].now = 7.0
    assert small.clock() == 7.0 and small.spec.healthy()
    assert router.model.headroom == 0.9 and router.model.slo("batch").prefer == "fast"


def test_candidates_and_slo_class(router: Router) -> None:
    resolve = {"small": "small", "big": "big", "large": "big"}
    assert router.candidates("auto", ANONYMOUS, lambda n: router.served[resolve[n]]) == ["big", "small"]
    assert router.candidates("large", ANONYMOUS, lambda n: router.served[resolve[n]]) == ["big"]
    free = Principal("u", limits=KeyLimits(allow_substitution=True))
    assert router.candidates("small", free, lambda n: router.served[resolve[n]]) == ["small", "big"]
    only = Principal("u", limits=KeyLimits(allowed_models=("small",)))
    assert router.candidates("auto", only, lambda n: router.served[resolve[n]]) == ["small"]
    assert router.slo_for(ANONYMOUS, " Batch ") == "batch"
    assert router.slo_for(Principal("u", limits=KeyLimits(slo_class="batch")), None) == "batch"
    assert router.slo_for(ANONYMOUS, None) == "interactive"
    with pytest.raises(InvalidRequest, match=r"Unknown SLO class 'gold'; use one of: interactive, batch\.") as err:
        router.slo_for(ANONYMOUS, "gold")
    assert err.value.code == "invalid_slo_class"


def test_a_route_and_the_errors_for_none(router: Router, engines: tuple[StubEngine, StubEngine]) -> None:
    info = router.route(query("auto", ["big", "small"], 1_000))
    assert isinstance(info, RouteInfo) and info.model == "big" and info.reason == "best: meets interactive"
    flight = router.start_flight("big", range(1_000), 100, None, info)
    assert router.snapshot()["routed"] == {"big": 1} and flight.lane is router.model.lanes["big"]
    with pytest.raises(SloUnattainable) as never:
        router.route(query("auto", ["big", "small"], 20_000))
    assert never.value.retry_after_s is None and never.value.headers == {"x-should-retry": "false"}
    assert "latency objective for this request even when idle: no model meets" in never.value.message
    router.start_flight("small", range(30_000), 100, None)
    router.start_flight("big", range(30_000), 100, None)
    with pytest.raises(SloUnattainable) as busy:
        router.route(query("auto", ["big", "small"], 1_000))
    assert busy.value.retry_after_s is not None and busy.value.headers["Retry-After"] == f"{busy.value.retry_after_s:g}"
    assert "under the current load: no model meets" in busy.value.message
    for e in engines:
        e.is_healthy = False
    with pytest.raises(EngineUnavailableError) as down:
        router.route(query("auto", ["big", "small"], 1_000))
    assert down.value.message == "No engine that can serve 'auto' is available now (big, small)."
    assert down.value.headers == {"Retry-After": "5"}
    snap = router.snapshot()
    assert snap["rejected"] == 2
    assert snap["models"]["big"]["in_flight"] == 2 and snap["models"]["small"]["running"] == 0  # type: ignore[index]


def test_a_hybrid_engine_with_prefix_caching_splits_prefills_on_block_boundaries() -> None:
    # Linear-attention state in vLLM's "align" mode: the lane predicts aligned chunks.
    state = KVGroup(kind="linear_attention", num_layers=2, block_size=16, page_bytes_per_layer=2048, mamba_mode="align")
    hybrid = dataclasses.replace(SPEC, groups=(*SPEC.groups, state))
    for spec, aligned in ((hybrid, True), (dataclasses.replace(hybrid, prefix_caching=False), False)):
        router = Router(ROUTING, [served("h", 10, StubEngine(spec))])
        assert router.model.lanes["h"].spec.aligned_chunks is aligned


async def test_requests_held_in_line_stay_held_until_their_turn(router: Router) -> None:
    """Held requests of one class on one engine are re-checked in turn
    (gateway/lifecycle/run.py): one waiting its turn is still held, its own hold over or not."""
    info = router.route(query("big", ["big"], 1_000, "batch"))
    assert isinstance(info, RouteInfo)
    flight = router.start_flight("big", range(1_000), 100, None, dataclasses.replace(info, hold_s=1.0))
    job = cast(Job, SimpleNamespace(served=router.served["big"], route=info))
    line = router.recheck_line("big", "batch")
    await line.acquire()  # another request of its class is being re-checked
    waiting = asyncio.ensure_future(_route_hold(job, flight, router, checked=True))
    router.served["big"].engine.now = 5.0  # type: ignore[attr-defined]
    await asyncio.sleep(0.3)  # past the line's 0.25 s poll: still waiting
    lane = router.model.lanes["big"]
    assert not waiting.done() and lane.ahead() == []
    line.release()
    await asyncio.wait_for(waiting, 5.0)  # its turn: nothing there to stall, so it goes
    assert lane.ahead() == [flight]


@pytest.mark.parametrize(("max_tokens", "set_by_client", "expected"), [(1_000, True, 1_000), (64_000, False, 512)])
def test_a_flight_expects_the_output_routing_predicted(
    router: Router, max_tokens: int, set_by_client: bool, expected: int
) -> None:
    """A request's flight expects the output its route was predicted for: max_tokens as the
    client set it (not capped at the default: a 1,000-token summary's slot looked free halfway
    through it, issue 21), else the default, not the context left that vLLM is given."""
    out = max_tokens if set_by_client else router.settings.default_output_tokens
    info = router.route(dataclasses.replace(query("big", ["big"], 1_000, "batch"), output_tokens=out))
    assert isinstance(info, RouteInfo) and info.output_tokens == expected
    request = SimpleNamespace(
        prompt_token_ids=range(1_000), sampling=SimpleNamespace(max_tokens=max_tokens), cache_salt=None
    )
    prompt = tokens.from_ids(range(1_000))
    job = cast(
        Job,
        SimpleNamespace(
            served=router.served["big"], route=info, requests=[request], prompts=[prompt], principal=ANONYMOUS
        ),
    )
    flight = _start_flight(router, job)
    assert flight is not None and flight.output_tokens == expected
