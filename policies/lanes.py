"""Each engine's load as routing sees it: the requests routed there (`Flight`) and what they
predict for a newcomer (`Lane`). Pure: times come from the lane's clock, and everything it
knows of its engine comes in as values (`LaneSpec`).

A newcomer's prediction on a lane (docs/routing.md):

    TTFT = max(wait for a running slot, the prefills ahead) + its own prefill,
           stretched where a busy engine on the same box overlaps it: engines take turns on
           the GPU, each slice of a step here waiting for a slice of the mate's (`turn_ratio`)
    TPOT = the model's time per token at the concurrency it will join, at its context,
           stretched likewise, and by the share of time recent prompts spend prefilling

and a check (`Lane.harms`) that its prefill would not push a request running there past
its TPOT objective, nor (where the engine caps prefill chunks) one still to prefill past
its TTFT objective.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from policies import kv
from policies.latency import LatencyModel, Prediction, Profile, slot_wait

BUSY_HISTORY_S = 600.0  # how far back box-mates' busy spans are kept (longer than any prefill)
MIN_HOLD_S = 0.5  # a hold extended at its end lasts at least this long
PREFILL_WINDOW_S = 60.0  # how far back the prefill share of an engine's time looks
MAX_PREFILL_SHARE = 0.8
MIN_STEP_S = 1e-4  # a step's floor in the turn-taking ratios (a profile may predict ~0 for a tiny prompt)
# A step waits for a busy box-mate's at most this long: the box model's `gpu_timeslice_s` (a
# step's total wait over its host syncs; docs/design/box-model.md).
GPU_TIMESLICE_S = 0.010


def _up() -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class LaneSpec:
    """One engine as routing reads it."""

    name: str
    profile: Profile  # its latency before any observation
    slots: int  # requests it runs at once
    clock: Callable[[], float]  # the engine's clock: a simulated engine runs faster than the wall's
    healthy: Callable[[], bool] = _up  # whether the engine is up now
    block_size: int = 16  # tokens per prefix-cache block
    cache_blocks: int = 0  # its prefix cache's pool (0: it caches no prefixes)
    chunk_tokens: int = 0  # a prompt's chunk while others run or wait (vLLM's long_prefill_token_threshold; 0: none)
    step_tokens: int = 0  # the scheduler's tokens per step (max_num_batched_tokens; 0: the chunk)
    # vLLM's "align" mode (linear-attention models with prefix caching): every chunk of a prompt
    # but its last ends on a block boundary (`prefill_ahead_s`).
    aligned_chunks: bool = False
    quality: float = 0.0  # candidates go best first
    box: str = ""  # engines on one box take turns on its GPU
    timeslice_s: float = GPU_TIMESLICE_S  # the longest a step waits for a box-mate's


@dataclass(frozen=True)
class Harm:
    """What a new request would do to the requests on an engine (see `Lane.harms`)."""

    reason: str = ""  # empty: it pushes none past its objective
    clears_s: float = 0.0  # seconds until the last one it would push is done
    slack_taken: float = 0.0  # the largest share of one's slack it would take (>= 1: harmed)


@dataclass(eq=False)
class Flight:
    """One routed request on its way through an engine: its timing feeds the model."""

    lane: Lane
    prompt_tokens: int
    output_tokens: int  # expected (max_tokens, or the routing default)
    keys: tuple[Hashable, ...]  # its prompt's prefix-cache keys
    routed_at: float
    user: str = ""  # who sent it: the admission queue takes users in turn
    tpot_objective: float | None = None  # its SLO's time per output token, protected from newcomers
    not_before: float = 0.0  # held until then (engine clock) so as not to stall running requests
    ttft_due: float | None = None  # its first token is due by then (engine clock; SLO with headroom)
    admitted_at: float | None = None
    first_at: float | None = None
    last_at: float | None = None
    cached_tokens: int = 0
    generated: int = 0
    concurrency_sum: int = 0  # running flights seen at each output, for the mean concurrency
    chunks: int = 0
    done: bool = False
    # At the end of its hold, seconds more to hold it so as not to take a reserved SLO
    # class's capacity (`LoadModel.reserve`); None: no class is reserved from it.
    reserve: Callable[[Flight], float] | None = None

    def admitted(self) -> None:
        self.admitted_at = self.lane.clock()

    @property
    def prefilling(self) -> bool:
        return self.admitted_at is not None and self.first_at is None

    def tokens(self, n: int, cached_tokens: int | None = None) -> None:
        """`n` new output tokens; the first call carries the engine's cached-token count."""
        now = self.lane.clock()
        if self.first_at is None:
            self.first_at = now
            self.cached_tokens = cached_tokens or 0
            self.lane.seen(self.keys)
            if self.admitted_at is not None:  # (the gateway and the box model admit it first)
                self._observe_ttft(self.admitted_at, now)
                self.lane.prefilled(self, self.admitted_at, now)
        self.last_at = now
        self.generated += n
        self.chunks += 1
        self.concurrency_sum += self.lane.running()

    def _observe_ttft(self, start: float, end: float) -> None:
        """Teach the model its prefill speed, as if it had had the box to itself. Another prompt
        prefilling here overlapped it: no lesson (how the engine splits steps between prompts is
        predicted explicitly, `prefill_ahead_s`). A busy box-mate: the time spent waiting for its
        steps comes out, as the predictions put it in (`mates_waited_s`), so the model learns its
        own speed on a box that is rarely quiet."""
        if self.lane.prefilling_within(start, end, self):
            return
        step = self.lane.prefill_step_s(self.prompt_tokens - self.cached_tokens)
        own = (end - start) - self.lane.mates_waited_s(start, end, step)
        self.lane.latency.observe_ttft(own, prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens)

    def finish(self) -> None:
        """Idempotent: observe the decode speed and leave the lane."""
        if self.done:
            return
        self.done = True
        self.lane.remove(self)
        if self.first_at is None or self.last_at is None or self.generated < 2 or self.chunks < 2:
            return
        # Its own decode speed, with the others' share taken out as the predictions put it in
        # (`predict_tokens`): time spent on other prompts' prefills is the engine's, not its
        # own (x (1 - share)), and so is the time its steps waited for a busy box-mate's. A
        # decode mostly spent beside prefills says too little of its own speed.
        span = self.last_at - self.first_at
        prefills = self.lane.prefilling_within(self.first_at, self.last_at, self)
        if span <= 0 or prefills > MAX_PREFILL_SHARE * span:
            return
        concurrency = max(1, round(self.concurrency_sum / self.chunks))
        context = self.prompt_tokens + self.generated // 2
        waited = self.lane.mates_waited_s(self.first_at, self.last_at, self.lane.step_s(concurrency, context))
        own = span - prefills - waited  # (none left: no lesson, `LatencyModel` drops it)
        self.lane.latency.observe_tpot(own / (self.generated - 1), concurrency=concurrency, context_tokens=context)

    def hold_again(self) -> float:
        """Seconds more to hold it at the end of its hold (0: send it now)."""
        wait = self.lane.hold_again(self)
        if not wait and self.reserve is not None:
            wait = self.reserve(self)
            self.not_before = self.lane.clock() + wait
        return wait

    @contextlib.contextmanager
    def waiting_for_recheck(self) -> Iterator[None]:
        """It waits for its turn to be re-checked behind a held request of its class (the
        gateway re-checks one at a time per engine, gateway/lifecycle/run.py): still held,
        its own hold's end passed or not, so newcomers are not predicted to queue behind it
        (`Lane.ahead`), as in the box model, which re-checks each at its hold's end."""
        due, self.not_before = self.not_before, math.inf
        try:
            yield
        finally:
            self.not_before = due

    def remaining_s(self, tpot_s: float) -> float:
        """Predicted seconds until it frees its slot (it runs to its expected length)."""
        return max(0, self.output_tokens - self.generated) * tpot_s


@dataclass(eq=False)
class Lane:
    """One engine's routing state."""

    spec: LaneSpec
    latency: LatencyModel
    flights: list[Flight] = field(default_factory=list)
    # A shadow of the engine's prefix cache: the blocks of prompts recently sent there.
    cache: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)
    # Engines on the same box: they take turns on its GPU, so work on one slows all.
    mates: list[Lane] = field(default_factory=list)
    # Prefill seconds routed here recently, (when, seconds): the share of the engine's time
    # that prompts take, which requests decoding here will also wait through.
    prefills: deque[tuple[float, float]] = field(default_factory=deque)
    # Their sum, kept as they come and go: the window holds every request of the last minute,
    # thousands at a few hundred a second, and routing reads the share for every request.
    prefills_s: float = 0.0
    # When this engine had requests: closed (start, end) spans and the open one's start.
    # A box-mate's work takes turns with this one's while it is busy (`turn_ratio`).
    busy_spans: deque[tuple[float, float]] = field(default_factory=deque)
    busy_since: float | None = None
    # Its step as its last busy span ended: what a box-mate took turns with then (`past_turn_s`).
    last_turn_s: float = 0.0
    # When prompts prefilled here: (admitted, first token) spans, in the order they ended.
    # What a request's timing shared with other prompts, so what it can teach the model.
    prefill_spans: deque[tuple[float, float, Flight]] = field(default_factory=deque)

    @property
    def slots(self) -> int:
        return self.spec.slots

    def clock(self) -> float:
        return self.spec.clock()

    def add(self, flight: Flight) -> None:
        if not self.flights:
            self.busy_since = self.clock()
        self.flights.append(flight)

    def remove(self, flight: Flight) -> None:
        if self.flights == [flight]:
            self.last_turn_s = self.turn_s()
        self.flights.remove(flight)
        if not self.flights and self.busy_since is not None:
            now = self.clock()
            self.busy_spans.append((self.busy_since, now))
            self.busy_since = None
            while self.busy_spans and self.busy_spans[0][1] < now - BUSY_HISTORY_S:
                self.busy_spans.popleft()

    def prefilled(self, flight: Flight, start: float, end: float) -> None:
        """`flight`'s prompt prefilled here from `start` (its admission) to `end` (now)."""
        self.prefill_spans.append((start, end, flight))
        while self.prefill_spans and self.prefill_spans[0][1] < end - BUSY_HISTORY_S:
            self.prefill_spans.popleft()

    def prefilling_within(self, t0: float, t1: float, flight: Flight) -> float:
        """Seconds between t0 and t1 during which a prompt other than `flight`'s prefilled here."""
        spans = [
            (a, t1) for f in self.flights if f is not flight and f.first_at is None and (a := f.admitted_at) is not None
        ]
        for a, b, f in reversed(self.prefill_spans):  # newest first, back to t0 (as `_busy_spans`)
            if b <= t0:
                break
            if f is not flight:
                spans.append((a, b))
        covered, reach = 0.0, t0
        for a, b in sorted((max(a, t0), min(b, t1)) for a, b in spans):
            if b > reach:
                covered += b - max(a, reach)
                reach = b
        return covered

    def mates_waited_s(self, t0: float, t1: float, step_s: float) -> float:
        """Seconds between t0 and t1 this engine spent waiting for its box-mates' steps, its own
        being `step_s` long: engines take turns on the GPU, so while a mate was busy each step
        here also took one of the mate's (`past_turn_s`)."""
        waited = 0.0
        for m in self.mates:
            busy = m.busy_between(t0, t1)
            if busy:
                ratio = self.turn_ratio(m.past_turn_s(), step_s)
                waited += busy * ratio / (1 + ratio)
        return min(waited, t1 - t0)

    def turn_s(self) -> float:
        """Seconds of one step of this engine's, as a box-mate's step waits for it: a decode step
        at its running concurrency, plus a prefill chunk while a prompt here has some to do. Idle:
        a step of one request (what it runs when work comes back)."""
        return self.prefill_step_s(sum(_to_prefill(f) for f in self.ahead()))

    def past_turn_s(self) -> float:
        """Its step lately, for the time a box-mate took turns with it: now while it is busy,
        else as its last busy span ended."""
        return self.turn_s() if self.flights else self.last_turn_s

    def prefill_step_s(self, tokens: int) -> float:
        """Seconds of a step here that prefills (a chunk of) `tokens` prompt tokens beside the
        decodes running here: at least a decode step, however few the tokens."""
        chunk = min(tokens, self.spec.step_tokens or self.spec.chunk_tokens or tokens)
        return self.step_s(max(1, self.running()), 0) + (self.prefill_s(chunk) if chunk > 0 else 0.0)

    def mates_turns(self) -> list[tuple[float, float]]:
        """Each box-mate's (predicted seconds until idle, seconds of its step): what `with_mates`
        stretches by, read once per decision (it walks every flight on the box)."""
        return [(m.busy_s(), m.turn_s()) for m in self.mates]

    def with_mates(self, seconds: float, step_s: float, turns: Sequence[tuple[float, float]] | None = None) -> float:
        """`seconds` of this engine's work from now, in steps of `step_s`, longer by the box-mates'
        steps it takes turns with while they are busy (`mates_turns`, or `turns` where the caller
        has them)."""
        turns = self.mates_turns() if turns is None else turns
        return seconds + sum(min(seconds, busy) * self.turn_ratio(turn, step_s) for busy, turn in turns)

    def turn_ratio(self, mate_step_s: float, step_s: float) -> float:
        """`turn_ratio` with this engine's GPU time slice."""
        return turn_ratio(mate_step_s, step_s, self.spec.timeslice_s)

    def busy_between(self, t0: float, t1: float) -> float:
        """Seconds between t0 and t1 during which this engine had requests."""
        return self._busy_spans(t0, t1)[0]

    def _busy_spans(self, t0: float, t1: float) -> tuple[float, int]:
        """Seconds between t0 and t1 during which this engine had requests, and in how many
        busy spans (the one under way included)."""
        busy = 0.0 if self.busy_since is None else max(0.0, t1 - max(self.busy_since, t0))
        spans = int(self.busy_since is not None)
        # Newest first, and only back to t0: the history holds a span per idle gap of the last
        # BUSY_HISTORY_S (thousands, at chat rates), and routing asks this of every box-mate.
        for a, b in reversed(self.busy_spans):
            if b <= t0:
                break
            busy += max(0.0, min(b, t1) - max(a, t0))
            spans += 1
        return busy, spans

    def prefilled_s(self, flight: Flight, now: float) -> float:
        """Prefill work (in idle-box seconds) done for `flight` since its admission: less the
        time its steps waited for a busy box-mate's."""
        if flight.admitted_at is None:
            return 0.0
        step = self.prefill_step_s(flight.prompt_tokens - flight.cached_tokens)
        return now - flight.admitted_at - self.mates_waited_s(flight.admitted_at, now, step)

    def ahead(self) -> list[Flight]:
        """The requests here a newcomer comes after: all but those routing holds back. A held
        one defers to newcomers: its hold ends with a check of what it would do then."""
        now = self.clock()
        return [f for f in self.flights if f.admitted_at is not None or f.not_before <= now]

    def running(self) -> int:
        return sum(1 for f in self.flights if f.admitted_at is not None)

    @contextlib.contextmanager
    def as_if_queued(self, flight: Flight) -> Iterator[None]:
        """Predict as if `flight` were queued here; busy spans untouched."""
        self.flights.append(flight)
        try:
            yield
        finally:
            self.flights.remove(flight)

    @contextlib.contextmanager
    def as_if_absent(self, flight: Flight) -> Iterator[None]:
        """Predict as if `flight` were not here; busy spans untouched."""
        i = self.flights.index(flight)
        del self.flights[i]
        try:
            yield
        finally:
            self.flights.insert(i, flight)

    def seen(self, keys: Sequence[Hashable]) -> None:
        for k in keys:
            self.cache[k] = None
            self.cache.move_to_end(k)
        while len(self.cache) > self.spec.cache_blocks:
            self.cache.popitem(last=False)

    def keys(self, prompt_ids: Sequence[Hashable], salt: str | None) -> tuple[Hashable, ...]:
        """The prompt's prefix-cache keys on this engine (none when it caches no prefixes)."""
        if not self.spec.cache_blocks:
            return ()
        return kv.prefix_keys(prompt_ids, self.spec.block_size, salt)

    def cached_tokens(self, keys: Sequence[Hashable]) -> int:
        n = 0
        for k in keys:
            if k not in self.cache:
                break
            n += 1
        return n * self.spec.block_size

    def queued_ahead(self, user: str | None = None, here: Sequence[Flight] | None = None) -> list[Flight]:
        """The queued requests here a newcomer from `user` waits behind, in order. The
        admission queue takes users in turn, least recently served first
        (policies/admission.py): the newcomer comes after its user's queued requests and, of
        each other user's, as many (one more where that user was served less recently). None:
        first come, first served (all of them). `here`: `ahead()`, where the caller has it."""
        here = self.ahead() if here is None else here
        queued = [f for f in here if f.admitted_at is None]
        if user is None:
            return queued
        served: dict[str, float] = {}  # each user's latest admission of those still here
        for f in here:
            if f.admitted_at is not None:
                served[f.user] = max(served.get(f.user, -math.inf), f.admitted_at)
        mine = sum(1 for f in queued if f.user == user)
        me = served.get(user, -math.inf)
        taken: dict[str, int] = {}
        out = []
        for f in queued:
            n = taken.get(f.user, 0)
            turns = mine if f.user == user else mine + (served.get(f.user, -math.inf) <= me)
            if n < turns:
                out.append(f)
                taken[f.user] = n + 1
        return out

    def predict_tokens(
        self, prompt_tokens: int, cached: int, output_tokens: int, user: str | None = None
    ) -> Prediction:
        """A newcomer's prediction here; `user`: who sends it (its place in the fair queue)."""
        here = self.ahead()
        running = [f for f in here if f.admitted_at is not None]
        queued = self.queued_ahead(user, here)
        concurrency = min(self.slots, len(running) + 1)
        step = self.step_s(concurrency, prompt_tokens)
        services = [
            self.latency.predict(prompt_tokens=f.prompt_tokens, concurrency=concurrency).total_s(f.output_tokens)
            for f in queued
        ]
        wait = slot_wait([f.remaining_s(step) for f in running], services, self.slots)
        # The prompts running and queued here delay its first token, not its decode
        # (prefills arriving later would: `harms` guards against those).
        own = self.latency.predict(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            concurrency=concurrency,
            context_tokens=prompt_tokens + output_tokens // 2,
        )
        ttft = max(wait, self.prefill_ahead_s(prompt_tokens - cached, queued)) + own.ttft_s
        decode = own.tpot_s * max(1, output_tokens)
        # Engines sharing the box take turns on its GPU: while a mate is busy, each step here
        # also waits for one of the mate's (`turn_ratio`). Stretch the part of the request the
        # mate overlaps: prefill chunks here, then decode steps.
        ttft_stretch = decode_stretch = 0.0
        if self.mates:
            chunk = self.prefill_step_s(prompt_tokens - cached)
            for m in self.mates:
                turn = m.turn_s()
                ttft_stretch += m.busy_within(0.0, ttft) * self.turn_ratio(turn, chunk)
                decode_stretch += m.busy_within(ttft, ttft + decode) * self.turn_ratio(turn, own.tpot_s)
        tpot = (decode + decode_stretch) / max(1, output_tokens) / (1 - self.prefill_share())
        return Prediction(ttft_s=ttft + ttft_stretch, tpot_s=tpot)

    def busy_within(self, t0: float, t1: float) -> float:
        """Expected seconds between t0 and t1 from now during which this engine has requests:
        all of it until its work now is done (`busy_s`); after a usual idle gap, its share of
        recent time. Its later work counts too: a long prompt on a box-mate prefills through
        the requests that keep arriving here (docs/routing.md)."""
        busy = self.busy_s()
        duty, gap = self.duty()
        again = busy + gap
        return min(t1, busy) - min(t0, busy) + duty * (max(t1, again) - max(t0, again))

    def duty(self) -> tuple[float, float]:
        """Share of the last PREFILL_WINDOW_S this engine had requests, and its mean idle gap."""
        now = self.clock()
        busy, spans = self._busy_spans(now - PREFILL_WINDOW_S, now)
        return busy / PREFILL_WINDOW_S, (PREFILL_WINDOW_S - busy) / max(1, spans)

    def prefill_share(self) -> float:
        """Share of the last PREFILL_WINDOW_S spent prefilling prompts routed here (capped)."""
        now = self.clock()
        while self.prefills and self.prefills[0][0] < now - PREFILL_WINDOW_S:
            self.prefills_s -= self.prefills.popleft()[1]
        if not self.prefills:
            self.prefills_s = 0.0  # no rounding error carried on
        return min(MAX_PREFILL_SHARE, max(0.0, self.prefills_s) / PREFILL_WINDOW_S)

    def prefilling_for(self, seconds: float) -> None:
        """A request routed here now will prefill for about `seconds` (`prefill_share`)."""
        self.prefills.append((self.clock(), seconds))
        self.prefills_s += seconds

    def step_s(self, concurrency: int, context_tokens: int) -> float:
        return self.latency.predict(prompt_tokens=1, concurrency=concurrency, context_tokens=context_tokens).tpot_s

    def busy_s(self) -> float:
        """Predicted seconds until this engine has nothing left to do."""
        here = self.ahead()
        if not here:
            return 0.0
        step = self.step_s(max(1, self.running()), 0)
        return self.prefill_all_s() + max(f.remaining_s(step) for f in here)

    def until_first_token(self, flight: Flight, now: float, before_tokens: int | None = None) -> float:
        """Predicted seconds until `flight` has its first token (0 once it has).
        `before_tokens`: the prompt tokens ahead of it still to prefill, when the caller
        has them (else counted here: a walk over every request on the engine)."""
        if flight.first_at is not None:
            return 0.0
        own = self.prefill_s(flight.prompt_tokens - flight.cached_tokens)
        if flight.admitted_at is not None:  # prefilling since then
            return max(0.0, own - self.prefilled_s(flight, now))
        if before_tokens is None:
            here = self.ahead()
            before = here[: here.index(flight)] if flight in here else here
            before_tokens = sum(_to_prefill(f) for f in before)
        return self.prefill_s(before_tokens) + own

    def prefill_ahead_s(self, new_tokens: int, queued: Sequence[Flight] | None = None) -> float:
        """Predicted seconds of other prompts' prefill before a new prompt of `new_tokens`
        has prefilled (`queued`: those waiting ahead of it; None: all). Without a chunk cap
        the engine prefills first come, first served: all of them. With one
        (`LaneSpec.chunk_tokens`), each prompt ahead takes at most a chunk of every step the
        new one prefills in, so a short prompt waits a chunk of each; with aligned chunks, only
        while a step has room for its first one."""
        cap = self.spec.chunk_tokens
        if not cap:
            return self.prefill_all_s(queued)
        left = self.prefills_left(queued)
        first = 0.0
        if self.spec.aligned_chunks:
            # Its first chunk must reach a block boundary (or its end): with the prompts ahead
            # each taking a chunk of every step, the step's room may be short of one, and then it
            # waits (and vLLM admits nobody after it) until enough of them have prefilled. E.g.
            # 2,096-token blocks and chunks in 4,096-token steps: a prompt of more than 2,000
            # tokens waits for all of a long prompt's prefill ahead of it.
            need = self.spec.block_size if new_tokens >= self.spec.block_size else 1
            beside = max(0, (self.spec.step_tokens or cap) - need) // cap  # prompts it can prefill beside
            if len(left) > beside:
                first = sum(left_s for _, left_s in left[: len(left) - beside])
                left = left[len(left) - beside :]
        steps = math.ceil(max(1, new_tokens) / cap)
        waits = [(f, left_s, min(left_s, steps * self.chunk_s(f, cap))) for f, left_s in left]
        total = first + sum(w for *_, w in waits)
        if len(self.ahead()) == 1 and waits:
            # A prompt alone is not capped: the step under way may be a whole budget of it.
            f, left_s, w = waits[0]
            total += min(left_s - w, self.chunk_s(f, self.spec.step_tokens or cap))
        return total

    def chunk_s(self, flight: Flight, tokens: int) -> float:
        """A chunk of `flight`'s prompt at its end: the longest one (attention grows with context)."""
        return self.prefill_s(flight.prompt_tokens) - self.prefill_s(max(0, flight.prompt_tokens - tokens))

    def prefills_left(self, queued: Sequence[Flight] | None = None) -> list[tuple[Flight, float]]:
        """Each prompt here still to prefill, in the engine's order (those admitted first, then
        `queued`, None: all waiting), with its predicted seconds left. The first one admitted
        has had the engine's prefill budget since its admission; the others are counted whole."""
        here = self.ahead()
        started = sorted((f for f in here if f.prefilling), key=lambda f: f.admitted_at or 0.0)
        waiting = [f for f in here if f.admitted_at is None] if queued is None else list(queued)
        out = [(f, self.prefill_s(f.prompt_tokens - f.cached_tokens)) for f in [*started, *waiting]]
        if started:
            first, work = out[0]
            out[0] = (first, max(0.0, work - self.prefilled_s(first, self.clock())))
        return out

    def prefill_backlog_s(self) -> float:
        """Predicted seconds until the requests running here have all prefilled."""
        return sum(left for f, left in self.prefills_left() if f.admitted_at is not None)

    def prefill_all_s(self, queued: Sequence[Flight] | None = None) -> float:
        """Predicted seconds until every prompt here running, and `queued` (None: all those
        waiting), has prefilled, one after another (first come, first served)."""
        waiting = [f for f in self.ahead() if f.admitted_at is None] if queued is None else queued
        return self.prefill_backlog_s() + self.prefill_s(sum(f.prompt_tokens - f.cached_tokens for f in waiting))

    def prefill_s(self, tokens: int) -> float:
        return self.latency.predict(prompt_tokens=tokens).ttft_s - self.latency.predict(prompt_tokens=0).ttft_s

    def harms(self, prompt_tokens: int, keys: Sequence[Hashable], skip: Flight | None = None) -> Harm:
        """What sending a new request here now would do to the requests already here: its
        prefill stalls their decodes (chunked prefill: about one token per chunk). Those it
        would push past their TPOT objective are harmed, and with a chunk cap so are those still
        to prefill that its chunks would push past their TTFT objective; `slack_taken` is the
        largest share of any one's TPOT slack it would take. A box-mate's requests are not
        counted: while it runs, the new request only slows them by the turns it takes on the
        GPU, and turning a chat away to spare them costs more than it saves (docs/routing.md)."""
        turns = self.mates_turns()  # once: it walks every flight on the box
        new = prompt_tokens - self.cached_tokens(keys)
        stall = self.with_mates(self.prefill_s(new), self.prefill_step_s(new), turns)
        now = self.clock()
        hurt = 0
        clears = 0.0  # when the last request it would hurt is done
        slack_taken = 0.0
        here = self.ahead()  # a held request is no victim: it is checked again when its hold ends
        # Prompt tokens still to prefill before each request here and after it (but `skip`),
        # counted once: per request they would make this quadratic in the requests here.
        todo = [_to_prefill(f) for f in here]
        before = list(itertools.accumulate(todo, initial=0))
        pending = [0 if f is skip else t for f, t in zip(here, todo, strict=True)]
        after = list(itertools.accumulate(reversed(pending), initial=0))  # after[k]: the last k
        n = len(here)
        running = max(1, self.running())
        for i, f in enumerate(here):
            if f is skip or f.tpot_objective is None or f.output_tokens < 2:
                continue  # (queued ones count too: they will decode beside it)
            step = self.step_s(running, f.prompt_tokens)
            decoded = 0.0 if f.first_at is None else now - f.first_at
            # Its decode still has to sit through the prompts routed here after it, all of it
            # slower while a box-mate is busy.
            remaining = self.with_mates(f.remaining_s(step) + self.prefill_s(after[n - 1 - i]), step, turns)
            slack = f.tpot_objective * (f.output_tokens - 1) - decoded - remaining
            if slack >= 0:
                slack_taken = max(slack_taken, stall / slack if slack else math.inf)
            if 0 <= slack < stall:  # it tips this one over
                hurt += 1
                clears = max(clears, self.until_first_token(f, now, before[i]) + remaining)
        # With a chunk cap its chunks also share the steps of the prompts still to prefill
        # here, delaying their first tokens by up to its own prefill (without one it waits).
        late = 0
        if self.spec.chunk_tokens:
            for i, f in enumerate(here):
                if f is skip or f.first_at is not None or f.ttft_due is None:
                    continue
                left = self.with_mates(
                    self.until_first_token(f, now, before[i]), self.prefill_step_s(_to_prefill(f)), turns
                )
                if now + left <= f.ttft_due < now + left + min(stall, left):
                    late += 1
                    clears = max(clears, left)
        if not (hurt or late):
            return Harm(slack_taken=slack_taken)
        why = " and ".join(
            f"it would push {n} running request{'s' if n > 1 else ''} past their {what} objective"
            for n, what in ((late, "TTFT"), (hurt, "TPOT"))
            if n
        )
        return Harm(why, clears, slack_taken)

    def hold_again(self, flight: Flight) -> float:
        """At the end of `flight`'s hold: seconds more to hold it (0: send it now). It is held
        again while it would still harm the requests here and can still meet its TTFT objective
        after waiting: holds are predictions, and a request that started late decodes late."""
        now = self.clock()
        harm = self.harms(flight.prompt_tokens, flight.keys, skip=flight)
        if not harm.reason or flight.ttft_due is None:
            return 0.0
        wait = max(harm.clears_s, MIN_HOLD_S)
        cached = self.cached_tokens(flight.keys)
        own = self.latency.predict(prompt_tokens=flight.prompt_tokens, cached_tokens=cached)
        if (
            now + wait + self.with_mates(own.ttft_s, self.prefill_step_s(flight.prompt_tokens - cached))
            > flight.ttft_due
        ):
            return 0.0
        flight.not_before = now + wait
        return wait


def turn_ratio(mate_step_s: float, step_s: float, slice_s: float, wait_s: float | None = None) -> float:
    """Seconds of a busy box-mate's work per second of an engine's, their steps being
    `mate_step_s` and `step_s` long, on a GPU switching after `slice_s`: each slice of work here
    (a step, or a time slice of a longer one) waits for a slice of the mate's, at most `wait_s`
    (None: a slice). Two long steps: half speed each; a short step beside a long one: it waits a
    whole slice. The box model (gateway/plan/fleet.py) stretches its steps by the same."""
    wait = slice_s if wait_s is None else wait_s
    return min(mate_step_s, wait) / max(min(step_s, slice_s), MIN_STEP_S)


def _to_prefill(f: Flight) -> int:
    """`f`'s prompt tokens the engine has still to prefill (0 once it has its first token)."""
    return f.prompt_tokens - f.cached_tokens if f.first_at is None else 0
