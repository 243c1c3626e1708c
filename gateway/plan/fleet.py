"""Boxes (DGX Sparks by default, or any `BoxSpec`) serving a workload in virtual time: the
routing benchmark and the capacity planner run on this.

Each model is a `BoxSim` (engine_adapter/spark/scheduler.py) placed on a box. Requests arrive
(Poisson, a mix of kinds, each with its SLO class); a strategy picks each one's model:

- "router": the gateway's own load model (policies/load.py), learning each engine's
  latency from what it observes, exactly as in the gateway (same code, virtual clock);
- "round-robin": the models in turn;
- a model's name: everything to that model.

Engines sharing a box take turns on its GPU: each engine is a process of its own, and a
GPU runs one process's kernels at a time, switching after a time slice
(`BoxSpec.gpu_timeslice_s`), so each slice of a step's work (the step, or a slice of a longer
one) waits for a slice of a busy box-mate's, at most `BoxSpec.mate_wait_s`. A short step beside
a long one pays most; halving each engine's bandwidth instead would make both twice as slow,
which is not what two engines on one GPU do (docs/design/box-model.md).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engine_adapter.spark import DGX_SPARK, MODELS, STEP_TOKENS, BoxSim, BoxSpec, GiB, Serving, SimConfig, StepResult
from gateway.router import load_model, slo_classes
from gateway.settings import LatencyProfile, ModelSettings, PlacementSettings, RoutingSettings
from policies.lanes import Flight, LaneSpec, turn_ratio
from policies.latency import Prediction, Profile
from policies.load import RouteInfo, RouteQuery


@dataclass(frozen=True)
class Link:
    """The interconnect of the boxes a tensor-parallel model spans: each all-reduce of a step's
    activations costs its latency plus a ring's 2(n-1)/n of the bytes over the link's bandwidth."""

    bytes_per_s: float = 22.5e9  # ConnectX-7 between two DGX Sparks: ~20-25 GB/s in public runs
    latency_s: float = 20e-6  # per all-reduce, NCCL over RoCE (an assumption: unmeasured here)

    def allreduce_s(self, nbytes: float, ranks: int) -> float:
        return self.latency_s + 2 * (ranks - 1) / ranks * nbytes / self.bytes_per_s


@dataclass(frozen=True)
class TensorParallel:
    """A model split over `ranks` boxes (vLLM's multi-node launch): each box reads 1/ranks of
    the weights and KV and does 1/ranks of the FLOPs, and every step all-reduces its tokens'
    activations `allreduces` times (2 per layer) over the link."""

    ranks: int
    allreduces: int  # per step: 2 per layer
    activation_bytes: int  # per token and all-reduce: hidden x 2 (BF16)
    link: Link = field(default_factory=Link)

    def step_s(self, tokens: int) -> float:
        return self.allreduces * self.link.allreduce_s(tokens * self.activation_bytes, self.ranks)


@dataclass(frozen=True)
class Deployed:
    """One model in a placement: which box it is on and the KV it gets there."""

    name: str  # the served name
    model: str  # a key of engine_adapter.spark.MODELS
    box: str
    kv_gib: float
    quality: float = 0.0
    latency: LatencyProfile = field(default_factory=LatencyProfile)
    max_num_batched_tokens: int = STEP_TOKENS  # the engine's scheduler, as configured
    long_prefill_token_threshold: int = 0
    # The engine's KV block in tokens, where it is not the serving's: vLLM stretches a hybrid
    # model's attention blocks to its linear-attention state page (2,096 / 1,568 tokens for the
    # Qwen3.6 shapes with FP8 KV), and the prefix cache then reuses whole blocks only.
    block_size: int | None = None
    # This machine's host time beyond the box model's, per engine step and per sequence in it (a
    # calibration probe's fit): hosts of one GPU model differ, and a synchronous scheduler's
    # step waits for its host's work, which grows with the sequences it samples and streams. The
    # GPU is free meanwhile: a busy box-mate's kernels run then, so the step's wait for the mate
    # and its host time overlap (the larger counts).
    host_step_s: float = 0.0
    host_seq_s: float = 0.0
    tp: TensorParallel | None = None  # split over the boxes of `box` ("box-1+box-2")
    # The model's n-gram table is read from the box's drive each step (`ple_table.placement`
    # disk): every step waits for its rows' pages (engine_adapter/spark/physics.py: ple_read_seconds).
    ple_table_on_disk: bool = False

    @staticmethod
    def of(m: ModelSettings, box: str, kv_gib: float | None = None) -> Deployed:
        """A configured model on `box` with `kv_gib` of KV (default: its whole-box budget)."""
        if m.simulated is None:
            raise ValueError(f"{m.name}: planning needs the model's `simulated` section (its box-model key)")
        kv = MODELS[m.simulated.model].kv_budget_gib if kv_gib is None else kv_gib
        return Deployed(
            m.name,
            m.simulated.model,
            box,
            kv,
            m.quality,
            m.latency,
            max_num_batched_tokens=m.max_num_batched_tokens or STEP_TOKENS,
            long_prefill_token_threshold=m.long_prefill_token_threshold,
            ple_table_on_disk=m.ple_on_disk,
        )


@dataclass(frozen=True)
class Placement:
    name: str
    models: tuple[Deployed, ...]
    box: BoxSpec = DGX_SPARK  # every box of the placement is one of these
    serving: Serving = field(default_factory=Serving)

    @property
    def boxes(self) -> list[str]:
        return sorted({m.box for m in self.models})


@dataclass(frozen=True)
class RequestKind:
    """A part of the workload: prompt and output sizes, its SLO class, its share of arrivals."""

    name: str
    share: float
    prompt_tokens: tuple[int, int]  # uniform between these
    output_tokens: int
    slo: str
    shared_prefix: int = 0  # tokens every request of this kind starts with (a system prompt)


# The team's mix: chat, questions about long documents, batch summaries.
DEFAULT_WORKLOAD = (
    # Chat: a shared 1,000-token system prompt (cacheable) + the conversation; 300 tokens back.
    RequestKind("chat", 0.70, (1_000, 3_000), 300, "interactive", shared_prefix=1_000),
    # Questions about a long document: 30-64K tokens in, 300 out.
    RequestKind("document", 0.10, (30_000, 64_000), 300, "document"),
    # Batch summaries: 8-16K in, 1,000 out, by a deadline.
    RequestKind("summary", 0.20, (8_000, 16_000), 1_000, "batch"),
)


@dataclass(frozen=True)
class Arrival:
    id: str
    t: float
    kind: RequestKind
    prompt: tuple[int, ...]


@dataclass
class Outcome:
    kind: str
    arrival: float
    model: str | None = None  # None: turned away
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    cached: int = 0  # prompt tokens its engine found in its prefix cache
    met: bool = False


@dataclass(frozen=True)
class Summary:
    strategy: str
    rate: float  # offered requests per second
    offered: int
    completed: int
    rejected: int
    met: int
    duration_s: float
    by_model: dict[str, int]
    by_kind: dict[str, tuple[int, int]]  # kind -> (met, offered)
    ttft_p50: float
    ttft_p95: float

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0

    @property
    def goodput(self) -> float:
        """Requests per second that met their SLO."""
        return self.met / self.duration_s

    @staticmethod
    def pool(runs: Sequence[Summary]) -> Summary:
        """Several runs (seeds) of one strategy at one load as one: counts add up; the
        TTFT quantiles are the runs' means."""
        kinds = {k for r in runs for k in r.by_kind}
        models = {m for r in runs for m in r.by_model}
        return Summary(
            strategy=runs[0].strategy,
            rate=runs[0].rate,
            offered=sum(r.offered for r in runs),
            completed=sum(r.completed for r in runs),
            rejected=sum(r.rejected for r in runs),
            met=sum(r.met for r in runs),
            duration_s=sum(r.duration_s for r in runs),
            by_model={m: sum(r.by_model.get(m, 0) for r in runs) for m in sorted(models)},
            by_kind={
                k: (sum(r.by_kind.get(k, (0, 0))[0] for r in runs), sum(r.by_kind.get(k, (0, 0))[1] for r in runs))
                for k in sorted(kinds)
            },
            ttft_p50=sum(r.ttft_p50 for r in runs) / len(runs),
            ttft_p95=sum(r.ttft_p95 for r in runs) / len(runs),
        )


def arrivals(kinds: Sequence[RequestKind], rate: float, duration_s: float, seed: int = 0) -> list[Arrival]:
    """Poisson arrivals at `rate` per second for `duration_s`, kinds drawn by share."""
    rng = random.Random(seed)
    prefixes = {k.name: tuple(rng.randrange(1000, 150_000) for _ in range(k.shared_prefix)) for k in kinds}
    weights = [k.share for k in kinds]
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        kind = rng.choices(kinds, weights)[0]
        n = rng.randint(*kind.prompt_tokens)
        own = tuple(rng.randrange(1000, 150_000) for _ in range(max(1, n - len(prefixes[kind.name]))))
        out.append(Arrival(f"r{len(out)}", t, kind, prefixes[kind.name] + own))
        t += rng.expovariate(rate)
    return out


class _Due:
    """What happens next outside the engines, by time: an arrival to route (model None) or
    a held request to send to its model. Ties go in the order they were pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Arrival, str | None]] = []
        self._seq = itertools.count()

    def push(self, t: float, a: Arrival, model: str | None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), a, model))

    def pop(self) -> tuple[float, Arrival, str | None]:
        t, _, a, model = heapq.heappop(self._heap)
        return t, a, model

    @property
    def next_at(self) -> float:
        return self._heap[0][0]

    def __bool__(self) -> bool:
        return bool(self._heap)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Lane:
    deployed: Deployed
    sim: BoxSim
    pending: StepResult | None = None  # the step under way, delivered at its end
    step_s: float = 0.0  # that step's own length, on a GPU to itself
    flights: dict[str, Flight] = field(default_factory=dict)


class Fleet:
    """The placement's engines on a shared virtual clock, fed by one strategy."""

    def __init__(self, placement: Placement, routing: RoutingSettings, strategy: str) -> None:
        self.placement = placement
        self.strategy = strategy
        self.clock = _Clock()
        self.lanes: dict[str, _Lane] = {}
        specs = []
        for d in placement.models:
            spec = MODELS[d.model]
            config = SimConfig(
                kv_cache_bytes=int(d.kv_gib * GiB),
                max_num_batched_tokens=d.max_num_batched_tokens,
                long_prefill_token_threshold=d.long_prefill_token_threshold,
                serving=placement.serving
                if d.block_size is None
                else dataclasses.replace(placement.serving, block_size=d.block_size),
                ple_table_on_disk=d.ple_table_on_disk,
            )
            box = placement.box
            if d.tp is not None:  # the ranks' bandwidth and FLOPs add up; the link is paid per step
                n = d.tp.ranks
                box = dataclasses.replace(
                    box,
                    memory_bytes=box.memory_bytes * n,
                    mem_bandwidth=box.mem_bandwidth * n,
                    bf16_flops=box.bf16_flops * n,
                    fp8_flops=box.fp8_flops * n,
                    fp4_flops=box.fp4_flops * n,
                )
            sim = BoxSim(spec, box, config)
            self.lanes[d.name] = _Lane(d, sim)
            kv = sim.kv_spec()
            specs.append(
                LaneSpec(
                    name=d.name,
                    profile=Profile(**d.latency.model_dump()),
                    slots=kv.max_num_seqs,
                    clock=self.clock,
                    block_size=kv.block_size,
                    cache_blocks=kv.usable_blocks if kv.prefix_caching else 0,
                    chunk_tokens=kv.long_prefill_token_threshold,
                    step_tokens=kv.max_num_batched_tokens,
                    aligned_chunks=sim.mamba_align,  # (its kv_spec keeps linear state out of the pool)
                    quality=d.quality,
                    box=d.box,
                    timeslice_s=placement.box.gpu_timeslice_s,
                )
            )
        self.slos = slo_classes(routing)  # the objectives themselves, no headroom
        self.model = load_model(routing, specs) if strategy == "router" else None
        self._rr = itertools.cycle([d.name for d in placement.models])
        self.outcomes: dict[str, Outcome] = {}
        self._due = _Due()  # arrivals, and held requests to send

    def _pick(self, a: Arrival) -> tuple[str | None, RouteInfo | None]:
        """The model for this arrival (None: turned away) and routing's decision."""
        if self.model is None:
            return (next(self._rr) if self.strategy == "round-robin" else self.strategy), None
        query = RouteQuery(
            requested="auto",
            candidates=list(self.model.lanes),
            slo_class=a.kind.slo,
            prompt_ids=a.prompt,
            output_tokens=a.kind.output_tokens,
        )
        info = self.model.route(query)
        return (info.model, info) if isinstance(info, RouteInfo) else (None, None)

    def _start_step(self, lane: _Lane) -> None:
        """Compute the lane's next step from now, stretched by the box-mates it takes turns with:
        for each whose step is under way, each slice of this step's work (the step, or a time
        slice of a longer one) waits for a slice of the mate's, at most the box's mate wait
        (`turn_ratio`; the router predicts the same with a wait of a whole slice, a little
        pessimistic for a short step beside a long one), and by this machine's host time where
        it exceeds that wait."""
        lane.sim.advance_to(self.clock.now)
        res = lane.sim.step()
        lane.step_s = own = res.duration
        d = lane.deployed
        host = d.host_step_s + d.host_seq_s * (res.decode_seqs + (res.prefill_tokens > 0))
        if d.tp is not None:  # the GPU waits for the link: it is this step's own time
            own += d.tp.step_s(res.prefill_tokens + res.decode_seqs)
            res = dataclasses.replace(res, end=res.start + own)
            lane.sim.now = res.end
            lane.step_s = own
        box = self.placement.box
        # Per box, the waits for its busy mates add up; a tensor-parallel step's ranks wait on
        # their boxes at once, so the longest box's wait counts.
        waits: dict[str, float] = {}
        for m in self.lanes.values():
            if m is lane or not m.pending or m.pending.end <= res.start:
                continue
            for b in set(m.deployed.box.split("+")) & set(lane.deployed.box.split("+")):
                waits[b] = waits.get(b, 0.0) + turn_ratio(m.step_s, own, box.gpu_timeslice_s, box.mate_wait_s)
        ratio = max(waits.values(), default=0.0)
        if ratio or host:
            # The host's work and the waits for a mate overlap: while this engine's host works,
            # the GPU runs the mate's kernels, the slice it would otherwise wait for. (A faster
            # host's negative fit takes at most half a step off.)
            extra = max(own * ratio, host) if ratio else host
            res = dataclasses.replace(res, end=res.start + max(own + extra, own / 2))
            lane.sim.now = res.end
        lane.pending = res

    def _admit_new(self, lane: _Lane) -> None:
        for rid, f in lane.flights.items():
            if f.admitted_at is None and lane.sim.blocks_held(rid) > 0:
                f.admitted()

    def _deliver(self, lane: _Lane, res: StepResult) -> None:
        for e in res.events:
            o = self.outcomes[e.request_id]
            flight = lane.flights.get(e.request_id)
            if e.new_tokens:
                if o.first is None:
                    o.first = self.clock.now
                    o.cached = e.num_cached_tokens or 0
                o.last = self.clock.now
                o.tokens += e.new_tokens
                if flight is not None:
                    if flight.admitted_at is None:
                        flight.admitted()
                    flight.tokens(e.new_tokens, e.num_cached_tokens)
            if e.finished and flight is not None:
                flight.finish()
                del lane.flights[e.request_id]

    def run(self, load: Iterable[Arrival]) -> None:
        for a in load:
            self._due.push(a.t, a, None)
        while True:
            pending = [(lane.pending.end, name) for name, lane in self.lanes.items() if lane.pending is not None]
            next_step = min(pending) if pending else None
            if self._due and (next_step is None or self._due.next_at <= next_step[0]):
                t, a, held_on = self._due.pop()
                self.clock.now = t
                if held_on is None:
                    self._arrive(a)
                else:  # a held request's hold is over: send it, unless routing holds it again
                    flight = self.lanes[held_on].flights.get(a.id)
                    if flight is not None and flight.hold_again():
                        self._due.push(flight.not_before, a, held_on)
                    else:
                        self._submit(a, held_on)
                continue
            if next_step is None:
                return
            end, name = next_step
            lane = self.lanes[name]
            self.clock.now = end
            res, lane.pending = lane.pending, None
            assert res is not None
            self._deliver(lane, res)
            if lane.sim.has_work:
                self._start_step(lane)
                self._admit_new(lane)

    def _arrive(self, a: Arrival) -> None:
        o = Outcome(kind=a.kind.name, arrival=a.t)
        self.outcomes[a.id] = o
        name, info = self._pick(a)
        if name is None:
            return
        o.model = name
        lane = self.lanes[name]
        if self.model is not None and info is not None:
            flight = self.model.start_flight(name, a.prompt, a.kind.output_tokens, None, info)
            lane.flights[a.id] = flight
            if info.hold_s > 0:  # routing holds it back, as the gateway would
                self._due.push(flight.not_before, a, name)
                return
        self._submit(a, name)

    def _submit(self, a: Arrival, name: str) -> None:
        lane = self.lanes[name]
        try:
            lane.sim.advance_to(self.clock.now)
            lane.sim.submit(a.id, a.prompt, a.kind.output_tokens, arrival_time=self.clock.now)
        except ValueError:  # cannot fit this engine at all: a failure, not a wait
            self.outcomes[a.id].model = None
            flight = lane.flights.pop(a.id, None)
            if flight is not None:
                flight.finish()
            return
        if lane.pending is None:
            self._start_step(lane)
            self._admit_new(lane)

    def summary(self, rate: float, duration_s: float, kinds: Sequence[RequestKind]) -> Summary:
        slos = {k.name: (self.slos[k.slo], k.output_tokens) for k in kinds}
        by_model: dict[str, int] = {}
        by_kind: dict[str, list[int]] = {k.name: [0, 0] for k in kinds}
        ttfts: list[float] = []
        met = completed = rejected = 0
        for o in self.outcomes.values():
            by_kind[o.kind][1] += 1
            if o.model is None:
                rejected += 1
                continue
            by_model[o.model] = by_model.get(o.model, 0) + 1
            slo, out = slos[o.kind]
            if o.first is None or o.last is None or o.tokens < out:
                continue
            completed += 1
            ttft = o.first - o.arrival
            ttfts.append(ttft)
            measured = Prediction(ttft_s=ttft, tpot_s=(o.last - o.first) / max(1, o.tokens - 1))
            if not slo.misses(measured, out):
                met += 1
                by_kind[o.kind][0] += 1
        ttfts.sort()
        return Summary(
            strategy=self.strategy,
            rate=rate,
            offered=len(self.outcomes),
            completed=completed,
            rejected=rejected,
            met=met,
            duration_s=duration_s,
            by_model=by_model,
            by_kind={k: (v[0], v[1]) for k, v in by_kind.items()},
            ttft_p50=_quantile(ttfts, 0.5),
            ttft_p95=_quantile(ttfts, 0.95),
        )


def _quantile(xs: Sequence[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def simulate(
    placement: Placement,
    routing: RoutingSettings,
    strategy: str,
    kinds: Sequence[RequestKind],
    rate: float,
    duration_s: float,
    seed: int = 0,
) -> Summary:
    """Offer `rate` requests/s for `duration_s`, run until every request is done."""
    fleet = Fleet(placement, routing, strategy)
    fleet.run(arrivals(kinds, rate, duration_s, seed))
    return fleet.summary(rate, duration_s, kinds)


def placement_from_settings(placement: PlacementSettings, models: Sequence[ModelSettings]) -> Placement:
    """A config's placement, with each model's box-model key, quality and latency profile."""
    by_name = {m.name: m for m in models}
    out = []
    for box in placement.boxes:
        for name in box.models:
            out.append(Deployed.of(by_name[name], box.name, box.kv_gib.get(name)))
    return Placement(placement.name, tuple(out))
