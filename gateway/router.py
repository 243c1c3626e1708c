"""Latency-SLO routing in the gateway: the served models' engines as lanes of the pure load
model (policies/load.py), each request's SLO class and candidate models, and the HTTP
errors for a request no model can take. See docs/routing.md.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence

from gateway.auth import Principal
from gateway.errors import EngineUnavailableError, InvalidRequest, SloUnattainable, retry_after_header
from gateway.registry import ServedModel
from gateway.settings import RoutingSettings
from policies.lanes import Flight, LaneSpec
from policies.latency import Profile
from policies.load import LoadModel, RouteInfo, RouteQuery
from policies.routing import NoRoute, Slo


def slo_classes(settings: RoutingSettings) -> dict[str, Slo]:
    """The configured SLO classes as routing reads them (objectives without headroom)."""
    return {
        name: Slo(name, c.ttft_s, c.tpot_s, c.deadline_s, prefer=c.prefer, reserve_slots=c.reserve_slots)
        for name, c in settings.classes.items()
    }


def load_model(settings: RoutingSettings, lanes: Sequence[LaneSpec]) -> LoadModel:
    """The load model over `lanes` with `settings`' classes, aliases, headroom and window."""
    return LoadModel(
        lanes, slo_classes(settings), aliases=settings.aliases, headroom=settings.headroom, window=settings.window
    )


def unknown_slo_class(settings: RoutingSettings, name: str, param: str | None = None) -> InvalidRequest:
    """The client's error for an SLO class `settings` does not have (a header, a key's limit)."""
    return InvalidRequest(
        f"Unknown SLO class {name!r}; use one of: {', '.join(settings.classes)}.", param=param, code="invalid_slo_class"
    )


def _lane(m: ServedModel, box: str) -> LaneSpec:
    """A served model's engine as a lane (its KV spec is fixed once it has started)."""
    engine = m.engine
    spec = engine.kv_spec
    return LaneSpec(
        name=m.name,
        profile=Profile(**m.settings.latency.model_dump()),
        slots=min(spec.max_num_seqs, m.settings.max_concurrency or spec.max_num_seqs),
        clock=engine.clock,
        healthy=lambda: engine.is_healthy,
        block_size=spec.block_size,
        cache_blocks=spec.usable_blocks if spec.prefix_caching else 0,
        chunk_tokens=spec.long_prefill_token_threshold,
        step_tokens=spec.max_num_batched_tokens,
        aligned_chunks=spec.aligned_chunks,
        quality=m.settings.quality,
        box=box,
    )


def route_decision(out: RouteInfo | NoRoute) -> tuple[str, str]:
    """A routing outcome as bounded metric labels: (model or "none", decision)."""
    if isinstance(out, NoRoute):
        return "none", "unavailable" if out.kind == "unavailable" else f"refused_{out.kind}"
    if out.reason.startswith("degraded"):
        decision = "degraded"
    elif out.reason.startswith("substituted"):
        decision = "substituted"
    else:
        decision = "chosen"
    return out.model, decision + ("_held" if out.hold_s > 0 else "")


class Router:
    """Picks each request's model by its SLO class and the load right now."""

    def __init__(
        self, settings: RoutingSettings, models: Sequence[ServedModel], boxes: Mapping[str, str] | None = None
    ) -> None:
        """`boxes`: each model's box (models absent from it, or all without it, share one)."""
        self.settings = settings
        self.served = {m.name: m for m in models}
        self.model = load_model(settings, [_lane(m, (boxes or {}).get(m.name, "")) for m in models])
        # Routing decisions for /metrics: (model, decision) -> count (gateway/metrics.py).
        self.decisions: Counter[tuple[str, str]] = Counter()
        self._recheck_lines: dict[tuple[str, str], asyncio.Lock] = {}
        # When models that are down should serve again (None: not soon); the engine
        # supervisor sets it (gateway/supervisor.py), else the load model's guess is used.
        self.down_retry_after: Callable[[Sequence[str]], float | None] | None = None
        # Models the canary found degraded (gateway/canary.py): aliases go elsewhere while
        # another model may serve.
        self.degraded: Callable[[], Collection[str]] = lambda: frozenset()

    def recheck_line(self, model: str, slo: str) -> asyncio.Lock:
        """The line held requests of class `slo` wait in for `model` (first come, first
        re-checked: an asyncio.Lock wakes its waiters in order)."""
        return self._recheck_lines.setdefault((model, slo), asyncio.Lock())

    def is_alias(self, name: str) -> bool:
        return name in self.settings.aliases

    def candidates(self, requested: str, principal: Principal, resolve: Callable[[str], ServedModel]) -> list[str]:
        """The models this request may go to, best first (an explicit model first of all)."""
        usable = [n for n in self.model.lanes if principal.may_use(self.served[n].settings.names)]
        bad = self.degraded()
        sound = [n for n in usable if n not in bad]
        if self.is_alias(requested):
            return sound or usable  # a degraded model still serves when it is the only one
        # A model named explicitly is served as asked; substitutes exclude degraded ones.
        own = resolve(requested).name
        rest = [n for n in sound if n != own]
        return [own, *rest] if self._may_substitute(principal) else [own]

    def _may_substitute(self, principal: Principal) -> bool:
        allowed = principal.limits.allow_substitution
        return self.settings.allow_substitution if allowed is None else allowed

    def slo_for(self, principal: Principal, header: str | None) -> str:
        """The request's SLO class: its header's, else its key's, else the default."""
        name = (header or "").strip().lower() or principal.limits.slo_class or self.settings.default_class
        if name not in self.settings.classes:
            raise unknown_slo_class(self.settings, name)
        return name

    def route(self, query: RouteQuery) -> RouteInfo:
        """The model to serve this request, decided before it queues anywhere: 503 when every
        candidate's engine is down, 429 `slo_unattainable` when none would meet its SLO."""
        out = self.model.route(query)
        self.decisions[route_decision(out)] += 1
        if isinstance(out, RouteInfo):
            return out
        if out.kind == "unavailable":  # down is not slow: a 503 to retry, not an SLO verdict
            retry: float | None = out.retry_after_s
            if self.down_retry_after is not None:
                retry = self.down_retry_after(query.candidates)
            if retry is None:  # every candidate is left down: retrying cannot help
                raise EngineUnavailableError(out.message, headers={"x-should-retry": "false"})
            raise EngineUnavailableError(out.message, headers={"Retry-After": retry_after_header(retry)})
        raise SloUnattainable(out.message, retry_after_s=out.retry_after_s)

    def start_flight(
        self,
        model: str,
        prompt_ids: Sequence[Hashable],
        output_tokens: int,
        salt: str | None,
        route: RouteInfo | None = None,
        user: str = "",
    ) -> Flight:
        """Start the timing record of `user`'s request sent (or held) for `model` as `route` decided."""
        return self.model.start_flight(model, prompt_ids, output_tokens, salt, route, user)

    def snapshot(self) -> dict[str, object]:
        out: dict[str, object] = {"routed": dict(self.model.routed), "rejected": self.model.rejected, "models": {}}
        for name, lane in self.model.lanes.items():
            idle = lane.latency.predict(prompt_tokens=1024)
            out["models"][name] = {  # type: ignore[index]
                "in_flight": len(lane.flights),
                "running": lane.running(),
                "observations": lane.latency.observations,
                "idle_ttft_s_1k": round(idle.ttft_s, 4),
                "idle_tpot_s": round(idle.tpot_s, 5),
                "learned": lane.latency.learned(),
            }
        return out
