"""Routing under load, as a pure model: which engine serves a request now, and the timing
record of each request sent there. Pure: values in, values out, times from each lane's clock.

`LoadModel.route` predicts the request on every candidate lane (policies/lanes.py), checks
what it would do to the requests already there and to the capacity kept for tighter SLO
classes (`reserve`), and lets `policies.routing.choose` decide: a `RouteInfo`, or a
`NoRoute` that says whether retrying can help. `LoadModel.start_flight` starts the `Flight` of a
request sent (or held) as routing decided; its timings correct the lane's latency model.
See docs/routing.md.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from policies.lanes import MIN_HOLD_S, Flight, Lane, LaneSpec
from policies.latency import LatencyModel, Prediction
from policies.routing import Candidate, NoRoute, Route, Slo, choose

# Holds kept for a reserved class end once this share of the held request's deadline is
# spent: waiting to its last moment leaves no room for the prediction's error, which grows
# with the minutes of work a deadline covers (on an engine slower than its profile, a held
# summary would otherwise be held to the end).
RESERVE_HOLD_SHARE = 0.5


@dataclass(frozen=True, kw_only=True)
class RouteQuery:
    """A request to route."""

    requested: str  # a model's name or an alias
    candidates: Sequence[str]  # the lanes it may go to, best first (a requested model first of all)
    slo_class: str  # a key of the model's classes
    prompt_ids: Sequence[Hashable]  # a prompt's cache keys (policies.tokens.Prompt.cache_keys)
    output_tokens: int  # expected (max_tokens, or a default)
    salt: str | None = None  # its prefix-cache salt
    user: str | None = None  # who sends it: the fair queue takes users in turn (None: first come, first served)


@dataclass(frozen=True)
class RouteInfo:
    """What routing decided for a request, for its response headers and its flight."""

    model: str
    slo: str
    reason: str
    predicted: Prediction
    tpot_objective: float | None = None
    ttft_objective: float | None = None
    hold_s: float = 0.0  # hold it this long before it goes to the engine (engine seconds)
    # The output tokens it was predicted for (`RouteQuery.output_tokens`): its flight's too.
    output_tokens: int = field(kw_only=True)


@dataclass(frozen=True)
class Reserve:
    """What a new request would take from a reserved SLO class's capacity (see
    `LoadModel.reserve`): nothing, or how long to hold it so that it does not."""

    wait_s: float = 0.0  # 0: it takes nothing
    why: str = ""  # what holding it keeps, for the route's reason
    # Requests of the reserved class expected while no engine is ready for them if it is
    # sent now: one that cannot wait is turned away when that is at least one.
    costs: float = 0.0


class LoadModel:
    """The engines' lanes and the SLO classes: routes each request by the load right now."""

    def __init__(
        self,
        lanes: Sequence[LaneSpec],
        classes: Mapping[str, Slo],
        *,
        aliases: Mapping[str, str],
        headroom: float = 1.0,
        window: int = 32,
    ) -> None:
        """`classes`: each SLO class's objectives themselves, by name. `aliases`: the names
        that route, and how ("best", "fast", or "class": the class's `prefer`). `headroom`:
        the share of each objective routing plans against. `window`: observations in each
        latency correction, and reserved classes' recent requests kept."""
        self.classes = dict(classes)
        self.aliases = dict(aliases)
        self.headroom = headroom
        self.lanes: dict[str, Lane] = {}
        for spec in sorted(lanes, key=lambda s: -s.quality):  # best first; stable for ties
            self.lanes[spec.name] = Lane(spec, LatencyModel(spec.profile, window=window))
        for lane in self.lanes.values():
            lane.mates = [m for m in self.lanes.values() if m is not lane and m.spec.box == lane.spec.box]
        self.routed: dict[str, int] = {}
        self.rejected = 0
        # Per reserved SLO class (`reserve_slots`), its recent requests (prompt tokens, cached
        # tokens, output tokens: an engine is kept ready for one sized like them, `reference`)
        # and arrival times (`rate`).
        self.recent: dict[str, deque[tuple[int, int, int]]] = {
            name: deque(maxlen=window) for name, slo in self.classes.items() if slo.reserve_slots
        }
        self.arrivals: dict[str, deque[float]] = {name: deque(maxlen=window) for name in self.recent}

    def slo(self, name: str) -> Slo:
        """Class `name` as routing plans against it: each objective scaled by the headroom."""
        return self.classes[name].scaled(self.headroom)

    def route(self, query: RouteQuery) -> RouteInfo | NoRoute:
        """The lane to serve `query`, decided before it queues anywhere, or why there is none."""
        q = query
        names = q.candidates
        slo = self.slo(q.slo_class)
        if q.slo_class in self.arrivals and names:
            self.arrivals[q.slo_class].append(self.lanes[names[0]].clock())
        predictions: dict[str, Prediction] = {}
        candidates = []
        cached: dict[str, int] = {}
        ready: dict[str, list[Lane]] = {}  # per reserved class, the engines ready for it now: once for all candidates
        for n in names:
            lane = self.lanes[n]
            keys = lane.keys(q.prompt_ids, q.salt)  # hashed once per engine (block sizes differ)
            cached[n] = lane.cached_tokens(keys)
            predictions[n] = lane.predict_tokens(len(q.prompt_ids), cached[n], q.output_tokens, q.user)
            harm = lane.harms(len(q.prompt_ids), keys)
            trial = Flight(
                lane,
                len(q.prompt_ids),
                q.output_tokens,
                keys,
                routed_at=lane.clock(),
                user=q.user or "",
                cached_tokens=cached[n],
            )
            reserve = self.reserve(trial, q.slo_class, ready)
            candidates.append(
                Candidate(
                    n,
                    predictions[n],
                    lane.spec.healthy(),
                    harms=harm.reason,
                    harm_clears_s=harm.clears_s,
                    slack_taken=harm.slack_taken,
                    reserve_s=reserve.wait_s,
                    reserve_why=reserve.why,
                    reserve_costs=reserve.costs,
                )
            )
        if not any(c.available for c in candidates):
            # Down is not slow: retry soon, no SLO verdict.
            down = ", ".join(names)
            message = f"No engine that can serve '{q.requested}' is available now ({down})."
            return NoRoute("no model is available", 5.0, "unavailable", message)

        def decide(slo: Slo) -> Route | NoRoute:
            strategy = self.aliases.get(q.requested)
            if strategy is not None:
                if strategy == "class":
                    strategy = self.classes[q.slo_class].prefer
                return choose(q.requested, candidates, slo, q.output_tokens, aliases={q.requested: strategy})
            # names[0] is the requested model; more names only where the key may substitute
            return choose(names[0], candidates, slo, q.output_tokens, aliases={}, allow_substitution=len(names) > 1)

        decision = decide(slo)
        if isinstance(decision, NoRoute) and self.headroom < 1:
            # Headroom is a margin to prefer, not a reason to turn away: a request predicted
            # to meet the objective itself is served (turning it away misses it for sure),
            # and one turned away is told which objective it misses.
            slo = self.classes[q.slo_class]
            decision = decide(slo)
        if isinstance(decision, NoRoute):
            self.rejected += 1
            return self._unattainable(decision, q, slo)
        self.routed[decision.model] = self.routed.get(decision.model, 0) + 1
        if q.slo_class in self.recent:
            self.recent[q.slo_class].append((len(q.prompt_ids), cached[decision.model], q.output_tokens))
        held = predictions[decision.model]
        return RouteInfo(
            model=decision.model,
            slo=q.slo_class,
            reason=decision.reason,
            predicted=Prediction(held.ttft_s + decision.hold_s, held.tpot_s),
            tpot_objective=slo.tpot_s,
            ttft_objective=slo.ttft_s,
            hold_s=decision.hold_s,
            output_tokens=q.output_tokens,
        )

    def _unattainable(self, no: NoRoute, q: RouteQuery, slo: Slo) -> NoRoute:
        """Busy (retry later) or impossible (no model meets it even idle: don't retry)."""
        idle = [
            Candidate(n, self.lanes[n].latency.predict(prompt_tokens=len(q.prompt_ids)), True)
            for n in q.candidates
            if self.lanes[n].spec.healthy()
        ]
        if idle and isinstance(
            choose(idle[0].model, idle, slo, q.output_tokens, aliases={}, allow_substitution=True), Route
        ):
            message = (
                f"No model can meet the '{slo.name}' latency objective under the current load: {no.reason}. "
                f"Retry in about {no.retry_after_s:g} s, or use a less urgent SLO class."
            )
            return NoRoute(no.reason, no.retry_after_s, "busy", message)
        message = (
            f"No model can meet the '{slo.name}' latency objective for this request even when idle: {no.reason}. "
            "Use a less urgent SLO class (e.g. batch) or a shorter prompt."
        )
        return NoRoute(no.reason, None, "impossible", message)

    def reference(self, cls: str) -> tuple[int, int, int] | None:
        """The request of reserved class `cls` an engine is kept ready for: the upper quartile
        of its recent ones by uncached prompt tokens (None before any)."""
        recent = sorted(self.recent[cls], key=lambda r: r[0] - r[1])
        return recent[(3 * (len(recent) - 1)) // 4] if recent else None

    def ready(self, lane: Lane, cls: str, reference: tuple[int, int, int]) -> bool:
        """Whether a request like `reference` of class `cls` would meet its objectives on `lane`."""
        prompt, cached, output = reference
        return not self.slo(cls).misses(lane.predict_tokens(prompt, cached, output), output)

    def reserve(self, flight: Flight, slo_name: str, ready_now: dict[str, list[Lane]] | None = None) -> Reserve:
        """What sending `flight` (of class `slo_name`, not yet on its lane) now would take from
        the classes with `reserve_slots`, kept for them because their objectives are tight and
        lenient work can wait (docs/routing.md):

        - slots: it would leave fewer than that many of its engine's free. Held until the
          first request running there is predicted done.
        - the last engine ready: every engine where a request like the class's recent ones
          meets its objectives now (`ready`) would be one no longer. Held until the prompts on
          another engine have prefilled; when it cannot wait that long and the class's
          requests expected meanwhile number at least one, turned away. No hold when waiting
          cannot help: no engine is ready now, or all are (none other will become ready).

        `ready_now` keeps, per reserved class, the engines ready for it, for the next call
        on the same state (the other candidates of one request).
        """
        lane = flight.lane
        ready_now = {} if ready_now is None else ready_now
        reserved = [c for c in self.recent if c != slo_name]
        if not reserved:
            return Reserve()
        keep = min(lane.slots - 1, max(self.classes[c].reserve_slots for c in reserved))
        here = lane.ahead()  # (`flight` is not on its lane yet, or taken off it: `Lane.as_if_absent`)
        if lane.slots - len(here) - 1 < keep:
            step = lane.step_s(max(1, lane.running()), 0)
            frees = min((f.remaining_s(step) for f in here if f.admitted_at is not None), default=0.0)
            return Reserve(max(MIN_HOLD_S, frees), f"to keep {keep} slot{'s' * (keep > 1)} free for {reserved[0]}")
        lanes = list(self.lanes.values())
        for cls in reserved:
            reference = self.reference(cls)
            if reference is None:
                continue
            if cls not in ready_now:
                ready_now[cls] = [x for x in lanes if self.ready(x, cls, reference)]
            ready = ready_now[cls]
            if not ready or len(ready) == len(lanes) or any(x is not lane and x not in lane.mates for x in ready):
                continue  # nothing to keep, nothing to wait for, or one it does not slow stays ready
            with lane.as_if_queued(flight):
                if any(self.ready(x, cls, reference) for x in ready):
                    continue
                # It keeps its engine from them until it has prefilled.
                blocks_s = lane.predict_tokens(flight.prompt_tokens, flight.cached_tokens, flight.output_tokens).ttft_s
            wait = max(MIN_HOLD_S, min(x.with_mates(x.prefill_all_s(), x.turn_s()) for x in lanes if x not in ready))
            return Reserve(wait, f"to keep an engine ready for {cls}", self.rate(cls) * min(wait, blocks_s))
        return Reserve()

    def rate(self, cls: str) -> float:
        """Recent arrivals of class `cls` per second (engine clock; 0 before two)."""
        times = self.arrivals[cls]
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0

    def _reserve_again(self, flight: Flight, slo: Slo) -> float:
        """At the end of `flight`'s hold: seconds more to hold it so as not to take a reserved
        class's capacity, while it is still predicted to meet its own objectives after waiting,
        with RESERVE_HOLD_SHARE of a deadline."""
        lane = flight.lane
        with lane.as_if_absent(flight):
            wait = self.reserve(flight, slo.name).wait_s
            if not wait:
                return 0.0
            own = lane.predict_tokens(flight.prompt_tokens, lane.cached_tokens(flight.keys), flight.output_tokens)
        waited = lane.clock() - flight.routed_at
        later = Prediction(waited + wait + own.ttft_s, own.tpot_s)
        if slo.deadline_s is not None:  # minutes of it: a first token's objective is seconds
            slo = dataclasses.replace(slo, deadline_s=slo.deadline_s * RESERVE_HOLD_SHARE)
        return 0.0 if slo.misses(later, flight.output_tokens) else wait

    def start_flight(
        self,
        model: str,
        prompt_ids: Sequence[Hashable],
        output_tokens: int,
        salt: str | None = None,
        route: RouteInfo | None = None,
        user: str = "",
    ) -> Flight:
        """Start the timing record of `user`'s request sent (or held) for `model` as `route` decided."""
        lane = self.lanes[model]
        keys = lane.keys(prompt_ids, salt)
        now = lane.clock()
        lane.prefilling_for(lane.prefill_s(len(prompt_ids) - lane.cached_tokens(keys)))
        flight = Flight(
            lane,
            len(prompt_ids),
            output_tokens,
            keys,
            routed_at=now,
            user=user,
            tpot_objective=None if route is None else route.tpot_objective,
            not_before=now + (0.0 if route is None else route.hold_s),
            ttft_due=None if route is None or route.ttft_objective is None else now + route.ttft_objective,
        )
        if route is not None and any(cls != route.slo for cls in self.recent):
            slo = self.slo(route.slo)
            flight.reserve = lambda f: self._reserve_again(f, slo)
        lane.add(flight)
        return flight
