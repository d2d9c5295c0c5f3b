"""The self-balancing runner (`bevy`): requests grouped layer by layer, in lanes.

Each request is a flight that decodes its current block (a prompt chunk or one token) one layer
per call (llama_decode_layers). Every call ends with the attention and router of the flight's
next layer (the next call resumes after that attention), so the scheduler knows which experts
each flight needs before it needs them: it starts those loads
at once (lagging flights first), runs the group of flights whose experts are loaded (lagging
first, see plan.py), and waits only when no flight is ready. Requests whose experts are resident
run ahead; groups batch the ready requests per layer, so shared weights are read once per group.

When a group holds every flight, its call goes on through the following layers while their
expected stall costs less than one more call (see _Lane._range_end): with fast loads or rare
misses, whole steps run in one call, which is blocking's schedule; with slow loads, calls stop
at each layer and the flights whose experts are in run ahead of those whose experts load.

Lanes: the sequences may be split into lanes, each a context of its own with this step loop on
its own thread and a share of the threads; the lanes share the expert cache, whose upload queue
orders every lane's loads lagging first. Lanes read more expert bytes than one context does
(each lane reads the union of its own tokens' experts: measured on the default model at a 50%
cache, two lanes of 4 pinned 1.66x the experts one context of 8 did), and pay only where a small
graph does not get faster with more threads, so by default (`lanes` 0) the runner measures
both on this machine before it decodes (calibrate.py) and runs the faster: one lane, or a lane
per thread.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf.config import DEFAULT_RUNAHEAD
from bevy_gguf.engine.cache_layout import DENSE
from bevy_gguf.engine.calibrate import (
    StepCosts,
    calibration_layers,
    choose_lanes,
    lane_candidates,
    time_step_costs,
)
from bevy_gguf.engine.cost_model import CallCostModel, CallShape, LinkTimePerLoad
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.engine.plan import (
    FIRST,
    Flight,
    Group,
    MergeCosts,
    PendingLoads,
    PolicyParams,
    admit_loads,
    call_end,
    nothing_to_share,
    own_end,
    plan,
    two_pass_pays,
    wave_limit,
)
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.runahead import RunaheadChooser
from bevy_gguf.engine.runners.batched import context_params
from bevy_gguf.engine.source import FixedSource, RequestSource
from bevy_gguf.engine.stats import RunStats
from bevy_gguf.errors import BevyError

WAIT_SLICE_MS = 50  # a wait for loads re-checks at least this often
RELATIVE_BASE = 1 << 16  # lane_clock relative: a priority step of 0 past the lane's clock (room for tokens behind it)
MISS_RATE_DECAY = 0.98  # per lookup: a layer's miss rate forgets old lookups at this rate
PASS_DECAY = 0.1  # a pass's Python time (and a group's share of distinct experts) moves the lane's average
                  # a tenth of the way


class SelfBalancingRunner:
    """Decodes requests layer by layer, n_parallel in flight at a time, in lanes."""

    def __init__(self, model: Model, cache: ExpertCache, n_parallel: int, n_threads: int = 2,
                 flash_attn_type: int = -1, wait_timeout_s: float = 300.0,
                 on_step: Callable[[int, list[Flight]], None] | None = None, load_window: int | None = None,
                 merge_misses: float | None = None, lanes: int = 1, split_factor: float = 1.0,
                 load_budget: float = 1.0,
                 lane_memo: dict[tuple[int, int], int] | None = None, two_pass: bool = True,
                 pass_memo: dict[tuple[int, int], StepCosts | None] | None = None, runahead: str = DEFAULT_RUNAHEAD,
                 prefill_wave: int = 16, prefill_first: str = "auto", kv_unified: bool = False,
                 wide_prefill: bool = False, lane_clock: str = "relative",
                 resident_steps: str = "rare-misses") -> None:
        self.model = model
        self.cache = cache
        self.n_parallel = n_parallel
        self.n_threads = n_threads
        self.flash_attn_type = flash_attn_type
        self.kv_unified = kv_unified  # one KV stream for every sequence (llama.cpp's -kvu), or one each
        self.wait_timeout_s = wait_timeout_s
        self.on_step = on_step  # called by each lane before each plan (tests cancel requests from it)
        # see plan.PolicyParams; default: flights up to one token ahead of the front get loads
        self.load_window = model.n_layer + 1 if load_window is None else load_window
        # a group that holds every flight of its lane extends its call through the following
        # layers where it expects fewer than this many misses (a miss there stalls the call, as
        # blocking does)
        self.merge_misses = merge_misses  # None: decide by the cost model (see _Lane._range_end)
        self.lanes = lanes  # at most; each gets an equal share of the threads; 0: measured (calibrate.py)
        self.lane_memo = {} if lane_memo is None else lane_memo  # (sequences, threads) -> lanes measured
        self.lane_seconds: dict[int, float] = {}  # what the measurement took per lane count
        self.lane_layers: int | None = None  # ... and the layers its calls ran (calibrate.resident_layers)
        self.lanes_used: int | None = None  # as the last serve ran
        self.micro_batch: int | None = None  # tokens per call, once the lanes are made
        self.permit_chunk: int | None = None  # ... of a prompt chunk with the prompt permit (_Lane._wave_chunk)
        self.split_factor = split_factor  # see plan.PolicyParams (0: run whatever is ready)
        self.load_budget = load_budget  # see _Lane._load_budget (0: no budget past the front)
        self.cost_models: list[CallCostModel] = []  # one per lane, as the last serve made them
        self.two_pass = two_pass  # see ExpertCache.attach (and plan.PolicyParams.two_pass)
        # (sequences, threads) -> what a second pass and a load beside a call cost (calibrate.time_step_costs)
        self.pass_memo = {} if pass_memo is None else pass_memo
        self.pass_overhead_s: float | None = None  # as the last serve measured it (None: not measured)
        self.load_contention_s = 0.0  # ... compute seconds a load moving during a call adds to it
        self.load_alone_s = 0.0  # ... link seconds per load with nothing computing (0: not measured)
        self.load_beside_s = 0.0  # ... and while a call computes (priced nowhere yet: reported)
        self.calls = 0  # layer-range calls of the last serve
        self.two_pass_calls = 0  # ... of them, those that ran two passes
        self.resident_calls = 0  # ... those of whole steps outside the plan (_Lane._whole_step)
        self.calibration_error: str | None = None  # ... why a start-up measurement failed (a load), if one did
        self.runahead = runahead  # auto | on | off: see runahead.py
        # prompt chunks that prefill together, layer-major (plan.py): a layer's experts load once for
        # them; more than a few tens only lengthens every scheduling pass (the plan is linear in flights)
        self.prefill_wave = prefill_wave
        self.prefill_first = prefill_first  # on | off | auto: see plan.PolicyParams.prefill_first, _Lane._plan_params
        self.wide_prefill = wide_prefill  # with lanes: calls with a prompt chunk on every thread (_Lane._ask_wide)
        self.wide_calls = 0  # layer-range calls of the last serve that ran on every thread
        self.runahead_stats: dict[str, float | int | None] = {}  # ... what the lanes measured of it
        self.time_split: dict[str, float] = {}  # ... where the lanes' time went (see _Lane.time_split)
        self.permit = PromptPermit()  # which lane's prompt chunks may pin more than its share (the last serve's)
        self.lane_clock = lane_clock  # own | relative: see _Lane._priority_step
        self.resident_steps = resident_steps  # rare-misses | all-in: see _Lane._whole_step

    def lanes_for(self, n_seq: int, asked: int | None = None) -> int:
        """How many lanes: as asked, but at most one per thread and per sequence, while the
        cache holds, for each lane, a token's experts for its calls and as many for what it
        reserves (lanes keep their reservations while they compute, see _Lane)."""
        asked = self.lanes if asked is None else asked
        lanes = max(1, min(asked or self.n_threads, self.n_threads, n_seq))
        while lanes > 1 and self.cache.min_class_slots // (2 * lanes) < self.cache.layout.min_slots(1):
            lanes -= 1
        return lanes

    def run(self, requests: list[Request]) -> RunStats:
        """Decode a fixed list of requests."""
        if not requests:
            return RunStats()
        n_seq = min(self.n_parallel, len(requests))
        params = context_params(requests, n_seq, self.n_threads, flash_attn_type=self.flash_attn_type,
                                kv_unified=self.kv_unified)
        return self.serve(FixedSource(requests), params, hold_decode=len(requests) <= n_seq)

    def serving_params(self, ctx_per_seq: int) -> ContextParams:
        """A context for a live queue: n_parallel sequences of ctx_per_seq tokens (split into lanes)."""
        return ContextParams(n_ctx=self.n_parallel * ctx_per_seq, n_batch=ctx_per_seq, n_seq_max=self.n_parallel,
                             n_threads=self.n_threads, flash_attn_type=self.flash_attn_type,
                             kv_unified=self.kv_unified)

    def serve(self, source: RequestSource, params: ContextParams, hold_decode: bool = False) -> RunStats:
        """Decode what source gives, as it comes (params.n_seq_max in flight at most); with
        hold_decode, generated tokens wait while any prompt prefills (in any lane)."""
        n_seq = params.n_seq_max
        self.calibration_error = None
        k = self.lanes_used = self.lanes_for(n_seq) if self.lanes else self._measured_lanes(params)
        costs = self._measured_step_costs(params, k)
        self.pass_overhead_s = costs.pass_overhead_s if costs and self.two_pass else None
        self.load_contention_s = costs.load_contention_s if costs else 0.0
        self.load_alone_s = costs.load_alone_s if costs else 0.0
        self.load_beside_s = costs.load_beside_s if costs else 0.0
        self.cache.set_concurrency(k)
        self.permit = PromptPermit()
        # every lane's in flight, by arrival index (Flight.index); each leaves when it finishes
        self.requests: dict[int, Request] = {}
        self._arrived = 0
        self._lock = threading.Lock()
        self._prefilling = k if hold_decode else 0  # lanes that decode only once it is 0 (hold_decode)
        self._prefilled = threading.Condition(self._lock)
        self._at_decode: dict[str, int] | None = None  # cache counters when decoding began
        lanes = []
        for i in range(k):
            seqs = n_seq // k + (i < n_seq % k)
            lane_params = params if k == 1 else dataclasses.replace(
                params, n_seq_max=seqs, n_ctx=max(1, params.n_ctx // n_seq) * seqs,
                n_threads=self.n_threads // k + (i < self.n_threads % k))
            lanes.append(_Lane(self, i, k, lane_params, hold_decode, most_seqs=-(-n_seq // k)))
        self.micro_batch = max(lane.chunk for lane in lanes)  # tokens per call of a prompt chunk
        self.permit_chunk = max(lane.permit_chunk for lane in lanes)  # ... of one with the prompt permit
        self.cost_models = [lane.cost_model for lane in lanes]
        errors: list[BaseException] = []

        def serve_lane(lane: _Lane) -> None:
            try:
                lane.serve(source)
            except BaseException as e:  # re-raised below, after every lane stopped
                errors.append(e)
            finally:
                self._lane_prefilled(lane)

        try:
            if k == 1:
                serve_lane(lanes[0])
            else:
                threads = [threading.Thread(target=serve_lane, args=(lane,), name=f"bevy-lane-{lane.owner}")
                           for lane in lanes]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        finally:
            self.cache.release_hooks()
        if errors:
            raise errors[0]
        return self._merge(lanes)

    @property
    def permit_prompts(self) -> int:
        """Prompts of the last serve that prefilled in the prompt permit's chunks."""
        return self.permit.taken

    def _measured_lanes(self, params: ContextParams) -> int:
        """One lane, every thread a lane of its own, or a count between (calibrate.lane_candidates),
        whichever this machine runs fastest (calibrate.py); measured once per (sequences, threads)
        and remembered."""
        n_seq = params.n_seq_max
        most = self.lanes_for(n_seq, asked=self.n_threads)
        key = (n_seq, self.n_threads)
        if key not in self.lane_memo:
            if most == 1 or not calibration_layers(self.cache, n_seq):
                self.lane_memo[key] = 1
            else:
                try:
                    with self.cache.not_learning():
                        self.lane_memo[key], self.lane_seconds, self.lane_layers = choose_lanes(
                            self.model, self.cache, dataclasses.replace(params, n_threads=self.n_threads),
                            lane_candidates(most))
                except BevyError as e:  # a load failed (the link): run one lane, measure again next time
                    self.calibration_error = str(e)
                    return 1
        return self.lane_memo[key]

    def _measured_step_costs(self, params: ContextParams, lanes: int) -> StepCosts | None:
        """What a second pass adds per MoE layer, and a load moving beside a call adds to it, for a
        lane's batch on a lane's threads (measured once per (sequences, threads) and remembered);
        None where the cache is too small to measure it (the lanes then run two passes throughout,
        and price no contention)."""
        seqs, threads = -(-params.n_seq_max // lanes), max(1, self.n_threads // lanes)
        key = (seqs, threads)
        if key not in self.pass_memo:
            lane_params = dataclasses.replace(params, n_seq_max=seqs, n_threads=threads)
            try:
                with self.cache.not_learning():
                    self.pass_memo[key] = time_step_costs(self.model, self.cache, lane_params)
            except BevyError as e:  # a load failed (the link): decode unmeasured, measure again next time
                self.calibration_error = str(e)
                return None
        return self.pass_memo[key]

    def _lane_prefilled(self, lane: _Lane) -> None:
        """A lane has no prompt left to prefill (or stopped): with hold_decode, it waits for the
        other lanes. The decode counters start when the first lane goes on."""
        with self._prefilled:
            if not lane.prefill_done:
                lane.prefill_done = True
                self._prefilling -= 1
                if self._prefilling <= 0:
                    self._prefilled.notify_all()
            while self._prefilling > 0:
                self._prefilled.wait()
            if self._at_decode is None:
                self._at_decode = self.cache.counters()

    def _merge(self, lanes: list[_Lane]) -> RunStats:
        """One RunStats over the lanes: decode time from the first lane's decode to the last
        lane's end, counters over that span, prefill time of the longest lane."""
        self.calls = sum(lane.calls for lane in lanes)
        self.runahead_stats = _sum_dicts([lane.runahead.as_dict() for lane in lanes])
        self.time_split = _sum_dicts([lane.time_split() for lane in lanes])  # type: ignore[assignment]
        if self.calls:
            self.time_split["python_per_call_ms"] = 1e3 * self.time_split["python_s"] / self.calls
        self.two_pass_calls = sum(lane.two_pass_calls for lane in lanes)
        self.wide_calls = sum(lane.wide_calls for lane in lanes)
        self.resident_calls = sum(lane.resident_calls for lane in lanes)
        stats = RunStats()
        for lane in lanes:
            stats.decode_tokens += lane.stats.decode_tokens
            stats.prefill_tokens += lane.stats.prefill_tokens
            stats.prefill_s = max(stats.prefill_s, lane.stats.prefill_s)
        starts = [lane.t_decode0 for lane in lanes if lane.t_decode0 is not None]
        if starts and stats.decode_tokens:
            stats.decode_s = max(lane.t_end for lane in lanes) - min(starts)
        totals = self.cache.counters()
        at_decode = self._at_decode or {}
        stats.decode_counters = {k: totals[k] - at_decode.get(k, 0) for k in totals}
        return stats


class PromptPermit:
    """Which lane, if any, may run prompt chunks larger than its share of the slots allows: the
    slots the other lanes' decode steps leave it (CacheLayout.prefill_shares). One lane at a time,
    so the lanes' pins never exceed the cache; a lane that cannot take it never waits for it (its
    prompt goes in its own smaller chunks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None
        self.taken = 0  # the prompts it let through (take's True answers)

    def take(self, lane: int) -> bool:
        """Whether `lane` may prefill one more prompt with the permit (it takes it if nobody holds it)."""
        with self._lock:
            if self.owner not in (None, lane):
                return False
            self.owner = lane
            self.taken += 1
            return True

    def give(self, lane: int) -> None:
        """`lane` gives it back (its reservations are about to shrink to its own share)."""
        with self._lock:
            if self.owner == lane:
                self.owner = None


class _Lane:
    """One context and its step loop: the flights of its sequences, grouped layer by layer.

    A lane keeps its reservations while it computes (loads landing meanwhile, its own or
    another lane's, would evict what its waiting flights hold: measured, 40% more bytes with two
    lanes, twice the bytes with one), so of its share of the slots (1/lanes) a lane reserves at
    most half and its calls' tokens fit in the other half: the lanes' pins never fill the cache,
    and no call can wait for a slot that only a waiting lane could free. A lane whose half share
    would hold smaller calls than its whole share (CacheLayout.lane_share) drops its reservations
    before each call instead, and its calls may then pin its whole share; there one lane at a
    time may hold the prompt permit (PromptPermit), the others pinning at most a decode step of
    their sequences and the holder the rest, in larger prompt chunks (CacheLayout.prefill_shares).
    """

    def __init__(self, runner: SelfBalancingRunner, owner: int, lanes: int, params: ContextParams,
                 hold_decode: bool, most_seqs: int) -> None:
        self.runner, self.model, self.cache = runner, runner.model, runner.cache
        self.owner = owner  # whose reservations these are, among the lanes sharing the cache
        self.lanes = lanes
        self.params = dataclasses.replace(params, n_ubatch=params.n_batch)  # one graph per call
        # slots are counted in the smallest slot class: what holds there holds at every layer
        slots = self.cache.min_class_slots
        self.keep_reservations, share = self.cache.layout.lane_share(slots, lanes, params.n_batch)
        # without reservations held, the lane holding the prompt permit may pin what the others'
        # decode steps leave (CacheLayout.prefill_shares): its prompt chunks hold a layer's experts
        shares = None if self.keep_reservations else self.cache.layout.prefill_shares(
            slots, lanes, most_seqs, params.n_batch)  # most_seqs: the largest lane's sequences
        self.shares = (share, share) if shares is None else shares  # (without, with the permit)
        self.chunk = self.cache.layout.micro_batch(self.shares[0], self.params.n_batch)
        self.permit_chunk = self.cache.layout.micro_batch(self.shares[1], self.params.n_batch)
        self._permit_waves: set[int] = set()  # requests (by index) whose waves the permit made
        # with reservations held, a call's tokens must fit its share at every layer it merges
        max_tokens = self.chunk if self.keep_reservations else self.params.n_batch
        dense = frozenset(il for il, c in enumerate(self.cache.layout.layer_class) if c == DENSE)
        self._set_policies(PolicyParams(n_layer=self.model.n_layer, max_tokens=max_tokens, max_experts=self.shares[0],
                                        hold_decode=hold_decode, load_window=runner.load_window,
                                        split_factor=runner.split_factor, two_pass=runner.two_pass,
                                        prefill_first=runner.prefill_first == "on", dense=dense))
        step_work = self.params.n_seq_max * self.model.n_layer  # token-layers of a step
        self.runahead = RunaheadChooser(epoch_work=2 * step_work, warm_work=step_work,
                                        fixed={"on": True, "off": False}.get(runner.runahead))
        self.cost_model = CallCostModel()  # this lane's calls on this machine (a lane: one thread count)
        self.stats = RunStats()
        self.prefill_done = False
        self.t_decode0: float | None = None
        self.t_end = 0.0
        self._waiting_since: float | None = None
        # nothing is known: assume misses (a dense layer has none)
        self.miss_rate = [0.0 if il in dense else 1.0 for il in range(self.model.n_layer)]
        self._seen = [(0, 0)] * self.model.n_layer
        # a cache that holds every expert: once a layer's are all in, it cannot miss again, however
        # slowly the average forgets the cold start (a tiny batch looks up a few experts a step)
        layout = self.cache.layout
        holds_all = all(n >= len(c.layers) * layout.n_expert for c, n in zip(layout.classes, self.cache.class_slots))
        self._all_in: set[int] | None = set() if holds_all else None
        self._flights = self.cache.flights()  # the native buffer of each pass's flights
        self._pass_s = 0.0  # this lane's Python time per scheduling pass (moving average)
        self._pass_py = 0.0  # ... of the current pass, before its call
        self._call_s = 0.0  # the current pass's call, from begin to end
        # the share of a group's k selections per token that are distinct experts (moving average)
        self._distinct_share = 1.0
        self._two_pass_on = runner.two_pass  # the context's setting now (attach sets it)
        self._per_load = LinkTimePerLoad(MISS_RATE_DECAY)  # link seconds per load, lately
        self.calls = 0
        self.two_pass_calls = 0  # calls that ran two passes (the others ran one)
        self.wide_calls = 0  # calls on every thread (_set_threads)
        self._wide_on = False  # the context's setting now: on every thread (_set_threads)
        self._asked = 1  # the gate weight its hook asks for (_ask_wide)
        self.resident_calls = 0  # whole-step calls outside the plan (_whole_step)
        self._loop_s = self._calls_s = self._waits_s = 0.0  # where the step loop's time went
        self._wave_end: dict[int, int] = {}  # per request (by index) prefilling: where its current wave ends
        # (request index, request, first position) of the waves a call's end made due: a prompt's next
        # wave, made after the call, at the step clock
        self._due_waves: list[tuple[int, Request, int]] = []
        # the lane's step clock: the progress (plan.Flight.progress) of its most lagging decode token,
        # which a prompt's wave takes when it starts (see _wave)
        self._clock = 0

    def time_split(self) -> dict[str, float]:
        """The step loop's seconds: in layer-range calls (from the compute gate's entry to the
        call's end), waiting for loads between calls, and the rest (Python: scheduling, hidden
        states, sampling, crossings into native code)."""
        return {"loop_s": self._loop_s, "calls_s": self._calls_s, "waits_s": self._waits_s,
                "python_s": max(0.0, self._loop_s - self._calls_s - self._waits_s)}

    def _set_policies(self, policy: PolicyParams) -> None:
        """The plan's parameters and their variants (without runahead, in one pass, a prompt first)."""
        self.policy = policy
        self.whole_policy = dataclasses.replace(policy, keep_whole=True)  # the plan without runahead
        self.one_pass_policy = dataclasses.replace(policy, two_pass=False)  # a call's range in one pass
        # prefill_first auto: the two plans again, with a prompt's last wave first
        self._first_policies = (dataclasses.replace(policy, prefill_first=True),
                                dataclasses.replace(self.whole_policy, prefill_first=True))

    def _wave_chunk(self, index: int) -> int:
        """Tokens per prompt chunk of request index's next wave: the permit's larger chunks where
        this lane holds the prompt permit or takes it now (PromptPermit), else the lane's own."""
        if self.permit_chunk <= self.chunk:
            return self.chunk
        if index not in self._permit_waves:
            if not self.runner.permit.take(self.owner):
                return self.chunk
            if not self._permit_waves:
                self._set_policies(dataclasses.replace(self.policy, max_experts=self.shares[1]))
            self._permit_waves.add(index)
        return self.permit_chunk

    def _keep_permit(self, flights: list[Flight]) -> None:
        """Before a pass reserves: give the prompt permit back once no wave it made is in flight
        (the pass then reserves within the lane's own share again)."""
        if self._permit_waves:
            self._permit_waves &= {f.index for f in flights if f.prefill}
            if not self._permit_waves:
                self._set_policies(dataclasses.replace(self.policy, max_experts=self.shares[0]))
                self.runner.permit.give(self.owner)

    def serve(self, source: RequestSource) -> None:
        with Context(self.model, self.params) as ctx:
            self.cache.attach(ctx, two_pass=self.runner.two_pass)
            try:
                self._loop(ctx, source, self.params.n_seq_max, self.stats)
            finally:
                self._keep_permit([])
                self.cache.unreserve_all(self.owner)

    # -- the step loop -------------------------------------------------------------------

    def _loop(self, ctx: Context, source: RequestSource, n_seq: int, stats: RunStats) -> None:
        runner = self.runner
        requests = runner.requests  # shared by the lanes, by arrival index: Flight.index
        free = list(range(n_seq))
        flights: list[Flight] = []
        t0 = time.perf_counter()
        step = 0
        while True:
            with runner._lock:  # admit new requests: their first prompt chunk
                for req in source.take(len(free)):
                    index, runner._arrived = runner._arrived, runner._arrived + 1
                    requests[index] = req
                    req.seq = free.pop(0)
                    flights += self._wave(index, req, 0)
            if not flights:
                self.runahead.idle()
                self._keep_permit(flights)
                self.cache.unreserve_all(self.owner)  # an idle server holds no slot
                if not source.idle_wait():
                    break
                continue
            self._tick(flights)
            if runner.on_step:
                runner.on_step(step, flights)
            flights = self._drop_cancelled(ctx, requests, flights, free)
            self._keep_permit(flights)
            if not flights:
                continue
            if not self.prefill_done and not any(f.prefill for f in flights):
                runner._lane_prefilled(self)  # with hold_decode: every lane's prompts are in first
            self._update_miss_rates()  # the last call's lookups
            if self._whole_step(flights):  # nothing can miss, or under one miss: blocking's step, unscheduled
                t_pass = time.perf_counter()
                step += 1
                self.t_decode0 = t_pass if self.t_decode0 is None else self.t_decode0
                self._resident_step(ctx, requests, flights, t0, stats)
                self._tick(flights)
                flights = self._retire(ctx, requests, flights, free)
                self._calls_s += self._call_s
                self._loop_s += time.perf_counter() - t_pass
                continue
            t_pass = time.perf_counter()
            since = self._refresh(flights)  # and the loads completed before it
            self._update_miss_rates()
            p = plan(flights, self._plan_params(flights), self._group_cost)
            self._pass_py = time.perf_counter() - t_pass
            if p.group is None and p.wait_for:  # a group is ready, but these flights' loads land sooner
                for i in p.wait_for:
                    flights[i].held = True  # once per layer: if the loads are late, go without it
                lead = min((flights[i] for i in p.wait_for), key=lambda f: f.lag)
                timeout_ms = max(1, min(WAIT_SLICE_MS, math.ceil(1e3 * p.wait_s)))
                t_wait = time.perf_counter()
                self.cache.wait(since, timeout_ms, lead.layer)
                self._count_wait(t_pass, t_wait)
                continue
            if p.group is None:  # nothing is ready: wait for a load (counted as stall)
                lead = min((flights[i] for i in p.waiting), key=lambda f: f.lag)
                t_wait = time.perf_counter()
                if not self.cache.wait(since, WAIT_SLICE_MS, lead.layer):
                    self._check_timeout(requests, flights)
                self._count_wait(t_pass, t_wait)
                continue
            step += 1
            if self.t_decode0 is None and not any(f.prefill for f in flights):
                self.t_decode0 = time.perf_counter()
            runnable = len(flights) - len(p.held_back)  # who could run while the group stalls
            self._run_group(ctx, requests, flights, p.group, runnable, t0, stats)
            self._tick(flights)  # the decode tokens that rode with a wave that ended are a step on
            for index, req, pos0 in self._due_waves:
                flights += self._wave(index, req, pos0)
            self._due_waves = []
            flights = self._retire(ctx, requests, flights, free)
            self._calls_s += self._call_s
            self._loop_s += time.perf_counter() - t_pass
        self.t_end = time.perf_counter()

    def _plan_params(self, flights: list[Flight]) -> PolicyParams:
        """The plan's parameters now: with runahead or groups whole (runahead.py), and with
        prefill_first auto, a prompt's last wave first while there is nothing for the decode
        tokens to share with it (_nothing_to_share)."""
        on = self.runahead.on
        if (self.runner.prefill_first == "auto" and any(f.prefill and f.final_wave for f in flights)
                and self._nothing_to_share(flights)):
            return self._first_policies[0 if on else 1]
        return self.policy if on else self.whole_policy

    def _nothing_to_share(self, flights: list[Flight]) -> bool:
        """plan.nothing_to_share, with this lane's distinct share and miss rates."""
        tokens = sum(1 for f in flights if not f.prefill and f.layer == FIRST)
        layout = self.cache.layout
        return nothing_to_share(tokens, layout.top_k, self._distinct_share,
                                [self.miss_rate[il] for il in layout.moe_layers])

    def _whole_step(self, flights: list[Flight]) -> bool:
        """Whether the step runs as one call of every layer in one pass, outside the plan: every
        flight starts a generated token that fits the call, and either every expert is in and
        stays in (a cache that holds them all, every layer's loaded: no plan can improve on it),
        or (resident_steps rare-misses) groups are kept whole and the lane's miss rates expect
        under one miss over the step (plan.nothing_to_share). Then the plan would run the same
        whole step, at the cost of its Python (0.56-0.70 ms a pass, measured on the default model
        at 90%), and a rare miss stalls the call as it stalls blocking's."""
        if not (len(flights) <= self.policy.max_tokens and all(f.layer == FIRST and not f.prefill for f in flights)):
            return False
        if self._all_in is not None and len(self._all_in) == len(self.cache.layout.moe_layers):
            return True
        return self.runner.resident_steps == "rare-misses" and not self.runahead.on and self._nothing_to_share(flights)

    def _resident_step(self, ctx: Context, requests: dict[int, Request], flights: list[Flight], t0: float,
                       stats: RunStats) -> None:
        """One whole-step call of every flight (each one token), in one pass, outside the plan:
        what blocking runs, without refreshing loads, the cost model or the pass decisions,
        whose Python is a few percent of a step where nothing misses (measured: bevy 0.94 of
        stock-resident at 100% against blocking's 0.97-0.99)."""
        if self._two_pass_on:  # nothing (or rarely one expert) loads: a second pass would only add graph nodes
            llama_ext.set_two_pass(ctx.lib, ctx.ptr, False)
            self._two_pass_on = False
        self._waiting_since = None
        self.calls += 1
        self.resident_calls += 1
        n_layer = self.model.n_layer
        members = in_sequence_order(flights)
        rows = [(f.tokens[0], f.pos0, f.seq, True) for f in members]
        done = self._decode(ctx, requests, members, rows, None, (0, n_layer, False, False), 0)
        if done is None:
            return
        self.runahead.record(len(rows) * n_layer, done[0])
        for row, f in enumerate(members):
            self._finish_block(ctx, requests, f, row, t0, stats)
        if self._all_in is None or len(self._all_in) < len(self.cache.layout.moe_layers):
            self._note_lookups()

    def _note_lookups(self) -> None:
        """The cache's hits and misses per MoE layer into the pass buffer, as a refresh leaves them:
        a whole step runs no refresh, and without this its lookups would never reach the miss rates
        (_update_miss_rates), so a lane whose steps once rarely missed would keep running them whole."""
        buf = self._flights
        for il in self.cache.layout.moe_layers:
            c = self.cache.native.counters(il)
            buf.hits[il], buf.misses[il] = c["hits"], c["misses"]

    def _decode(self, ctx: Context, requests: dict[int, Request], members: list[Flight],
                rows: list[tuple[int, int, int, bool]], hidden: list[np.ndarray] | None,
                layers: tuple[int, int, bool, bool], count_from: int) -> tuple[float, float, int, float, int] | None:
        """One llama_decode_layers call of members (layers: il_begin, il_end, lookahead, reuse) inside
        its turn at the compute gate; sets _call_s. Returns (its start, when the gate let it in,
        experts it pinned, seconds it waited, loads that landed while it ran), or None: it failed,
        and so did its members."""
        if not self.keep_reservations:  # the call pins what it uses; held ones could only deadlock it
            self.cache.unreserve_all(self.owner)
        self._ask_wide(ctx, any(f.prefill for f in members))
        start_t = time.perf_counter()
        self.cache.begin(ctx, self._priority_step(min(f.progress for f in members)), count_from)
        call_t = time.perf_counter()  # after the gate let it in
        version = self.cache.version()
        self._set_threads(ctx)
        try:
            ctx.decode_layers(rows, hidden, *layers)
        except BevyError as e:
            for f in members:  # the failed call took their cells with it
                requests[f.index].fail(str(e))
            return None
        finally:
            used_experts, waited_s = self.cache.end(ctx)
            self._call_s = time.perf_counter() - start_t
        return start_t, call_t, used_experts, waited_s, self.cache.version() - version

    def _ask_wide(self, ctx: Context, prompt: bool) -> None:
        """A call with a prompt chunk asks the compute gate for every lane's turn (wide_prefill,
        with lanes): it gets it where no other lane computes at its turn (_set_threads), and then
        runs on every thread. A prompt chunk's matmuls are large enough to speed up with every
        thread, where a lane's few decode tokens are not (which is why lanes pay, calibrate.py);
        on its share alone a prompt took twice as long on 2 threads, and so did the TTFT of every
        request and the step of the decode tokens riding with it. It does not wait for the gate
        to empty: that left a core idle for the other lane's whole call (measured: 4-11% fewer
        tok/s on 2 threads)."""
        want = self.lanes if prompt and self.lanes > 1 and self.runner.wide_prefill else 1
        if want != self._asked:
            ctx.hook.set_gate_weight(want)
            self._asked = want

    def _set_threads(self, ctx: Context) -> None:
        """The call's threads: every thread where the gate let it in alone (_ask_wide), else the
        lane's share."""
        wide = self._asked > 1 and ctx.hook.gate_weight() == self._asked
        self.wide_calls += wide
        if wide != self._wide_on:
            ctx.set_threads(self.runner.n_threads if wide else self.params.n_threads)
            self._wide_on = wide

    def _tick(self, flights: list[Flight]) -> None:
        """Move the step clock to the most lagging decode token (it never goes back)."""
        decoding = [f.progress for f in flights if not f.prefill]
        if decoding:
            self._clock = max(self._clock, min(decoding))

    def _priority_step(self, progress: int) -> int:
        """The step part of the priority of a flight's loads and of its call at the compute gate
        (lagging first, then the lower layer). One lane: its progress on the lane's step clock.
        With lanes (lane_clock relative, the default): its progress past its own lane's clock,
        so that every lane's lagging tokens tie on the step and their loads go by layer: the lane
        behind in the layers is served first and catches up, and what one lane loads is still in
        when the other comes to that layer. The lanes' own clocks are no common measure: they
        stood 5 or more steps apart half of the time (default model, 25%, the serving stream),
        and the lane behind on its clock took the link whatever its layer, so the lanes drifted
        two or more layers apart 40% of the time and loaded experts twice (measured there:
        relative loads 0.97x the bytes, at 0.96x, 1.09x and 1.09x the tok/s in three invocations;
        README). lane_clock own: the lane's clock, as before."""
        if self.lanes == 1 or self.runner.lane_clock == "own":
            return progress
        return max(0, RELATIVE_BASE + progress - self._clock)

    def _count_wait(self, t_pass: float, t_wait: float) -> None:
        """A pass that ended in a wait for loads (from t_wait): its time, the wait's apart."""
        now = time.perf_counter()
        self._waits_s += now - t_wait
        self._loop_s += now - t_pass

    def _refresh(self, flights: list[Flight]) -> int:
        """Reserve what the admitted flights need, start their loads, and mark who is ready
        (one libbevy call, bevy_cache_refresh); returns the cache's version before it."""
        admitted = admit_loads(flights, self.policy, self._load_budget(flights))
        rest = [i for i, f in enumerate(flights) if f.layer != FIRST and i not in admitted]
        order = admitted + rest  # loads start lagging first
        buf = self._flights
        buf.fill([flights[i].layer for i in order], [flights[i].experts for i in order],
                 [(self._priority_step(flights[i].progress) << 32) | ((flights[i].layer + 1) << 16) for i in order],
                 [True] * len(admitted) + [False] * len(rest), [not flights[i].counted for i in order])
        self.cache.refresh(self.owner, buf)
        missing, eta = dict(zip(order, buf.absent())), dict(zip(order, buf.eta_s()))
        for i, f in enumerate(flights):
            f.ready = f.layer == FIRST or missing[i] == 0
            f.eta = 0.0 if f.ready else eta[i]
            f.missing = 0 if f.ready else missing[i]
            f.held = f.held and not f.ready
            f.counted = True
        return buf.pass_.version

    def _load_budget(self, flights: list[Flight]) -> int | None:
        """Distinct experts that the flights past the front may have loading or held (plan.admit_loads):
        load_budget times the expected union of one batched visit of every started flight at one
        layer (their tokens x top_k x the lane's distinct share), which is what blocking loads and
        pins at a time. Uncapped by a layer's experts: a prompt wave's chunks ahead of the front
        need the next layer's, which load while the chunks behind compute (plan.py); decode
        tokens alone get a fraction of a layer. None: no budget (load_budget 0)."""
        if self.runner.load_budget <= 0:
            return None
        layout = self.cache.layout
        tokens = sum(len(f.tokens) for f in flights if f.layer != FIRST)
        union = tokens * layout.top_k * self._distinct_share
        return max(1, math.ceil(self.runner.load_budget * union))

    def _group_cost(self, members: list[Flight]) -> float | None:
        """The compute seconds this lane's cost model predicts for a one-layer call of members."""
        if not members or members[0].layer == FIRST:
            return None
        experts = len(set().union(*(f.experts for f in members)))
        tokens = sum(len(f.tokens) for f in members)
        context = sum(len(f.tokens) * f.pos0 + len(f.tokens) * (len(f.tokens) + 1) // 2 for f in members)
        return self.cost_model.predict(CallShape(layers=1, tokens=tokens, experts=experts, context=context))

    def _merge_costs(self, members: list[Flight]) -> MergeCosts | None:
        """What this lane measured that prices a call of members (None: too few calls yet)."""
        layout = self.cache.layout
        tokens = sum(len(f.tokens) for f in members)
        distinct = min(layout.n_expert, tokens * layout.top_k * self._distinct_share)
        context = sum(len(f.tokens) * (f.pos0 + 1) for f in members)
        overhead = self.cost_model.call_overhead()
        return None if overhead is None else MergeCosts(
            overhead_s=overhead + self._pass_s, load_s=self._link_s_per_load(), distinct=distinct,
            layer_s=self.cost_model.predict(CallShape(1, tokens, round(distinct), context)) or 0.0,
            contention_s=self.runner.load_contention_s)

    def _link_s_per_load(self) -> float:
        """Link seconds per expert load: as measured lately (cost_model.LinkTimePerLoad; before
        any load, a job's time over the workers), but no more than the link took at start with
        nothing computing (a link that copies through the CPU is slower beside the compute, and
        what a stall costs is its time alone)."""
        c = self.cache.counters()
        value = self._per_load.update(c["link_busy_ns"], c["loads"])
        lately = self._flights.pass_.load_ns / 1e9 / self.cache.n_workers if value is None else value
        alone = self.runner.load_alone_s
        return min(lately, alone) if alone > 0 else lately

    def _range_end(self, group: Group, members: list[Flight], n_flights: int, costs: MergeCosts | None,
                   limit: int | None, policy: PolicyParams | None = None) -> int:
        """Where the group's call stops (plan.call_end), with what this lane has measured."""
        layout = self.cache.layout
        tokens = sum(len(f.tokens) for f in members)
        merge_misses = self.runner.merge_misses if self.runahead.on else math.inf  # whole: one call per step
        return call_end(group, n_flights, tokens, policy or self.policy, layout.top_k, layout.n_expert,
                        self.miss_rate, costs, merge_misses, runahead=self.runahead.on, limit=limit)

    def _set_passes(self, ctx: Context, want: bool) -> None:
        """Build the next graph with (or without) the second passes."""
        if want != self._two_pass_on:
            llama_ext.set_two_pass(ctx.lib, ctx.ptr, want)
            self._two_pass_on = want
        self.two_pass_calls += want

    def _moe_layers(self, il_begin: int, il_end: int) -> int:
        """The MoE layers (those with routed experts) of a call over [il_begin, il_end)."""
        return sum(il not in self.policy.dense for il in range(il_begin, il_end))

    def _two_passes_pay(self, group: Group, members: list[Flight], il_begin: int, il_end: int,
                        costs: MergeCosts | None) -> bool:
        """One pass or two for this call's MoE layers (plan.two_pass_pays): what the first pass
        at the group's own layer hides of its members' pending loads, and at the layers whose
        experts are not known yet (those after it; from layer 0 for a new block) of the expected
        ones, against a second pass on every MoE layer the call computes."""
        unknown = range(own_end(group), il_end)
        loading = [f for f in members if not f.ready]
        pending = None
        if loading:
            union = len(set().union(*(f.experts for f in members))) or 1
            loads = min(union, sum(f.missing for f in loading))
            pending = PendingLoads(seconds=max(math.inf if f.eta is None else f.eta for f in loading),
                                   loads=loads, resident=1.0 - loads / union)
        return two_pass_pays(unknown, self.miss_rate, costs, self._pass_overhead_s(),
                             self._moe_layers(il_begin, il_end), pending)

    def _pass_overhead_s(self) -> float | None:
        """What a second pass costs a MoE layer: the start-up calibration's (every expert resident,
        so its second pass computes nothing), or what this lane's calls with real second passes
        computed more (cost_model.CallCostModel.two_pass_overhead), whichever is larger. None:
        not calibrated (two passes throughout)."""
        calibrated = self.runner.pass_overhead_s
        fitted = self.cost_model.two_pass_overhead()
        return calibrated if calibrated is None or fitted is None else max(calibrated, fitted)

    def _update_miss_rates(self) -> None:
        """Per layer, a moving average of the fraction of lookups that missed, weighted per
        lookup (a step of 8 tokens moves it about halfway); the lookups are the last pass's."""
        hits, misses = self._flights.hits, self._flights.misses
        for il in range(self.model.n_layer):
            dh, dm = hits[il] - self._seen[il][0], misses[il] - self._seen[il][1]
            if dh + dm:
                alpha = 1.0 - MISS_RATE_DECAY ** (dh + dm)
                self.miss_rate[il] += alpha * (dm / (dh + dm) - self.miss_rate[il])
                self._seen[il] = (hits[il], misses[il])
        if self._all_in is not None:
            for il in self.cache.layout.moe_layers:
                if il not in self._all_in:
                    c = self.cache.counters(il)
                    if c["loads"] - c["evictions"] >= self.cache.layout.n_expert:
                        self._all_in.add(il)
                if il in self._all_in:
                    self.miss_rate[il] = 0.0

    def _check_timeout(self, requests: dict[int, Request], flights: list[Flight]) -> None:
        """Nothing ran for wait_timeout_s: the flights waiting for loads fail (the loop drops them
        at its next step); the others, and the lane, go on."""
        now = time.perf_counter()
        if self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since > self.runner.wait_timeout_s:
            for f in flights:
                if not f.ready and not requests[f.index].finished:
                    requests[f.index].fail(f"timed out after {self.runner.wait_timeout_s:g} s waiting for experts "
                                           f"(at layer {f.layer})")
            self._waiting_since = None

    def _run_group(self, ctx: Context, requests: dict[int, Request], flights: list[Flight], group: Group,
                   runnable: int, t0: float, stats: RunStats) -> None:
        t_enter = time.perf_counter()
        self._call(ctx, requests, flights, group, runnable, t0, stats)
        # this pass's Python: the scheduling before, and the group's work around its call
        py = self._pass_py + time.perf_counter() - t_enter - self._call_s
        self._pass_s = py if self._pass_s == 0 else self._pass_s + PASS_DECAY * (py - self._pass_s)

    def _call(self, ctx: Context, requests: dict[int, Request], flights: list[Flight], group: Group,
              runnable: int, t0: float, stats: RunStats) -> None:
        self._waiting_since = None
        self._call_s = 0.0
        members = in_sequence_order(flights[i] for i in group.members)
        n_layer = self.model.n_layer
        costs = self._merge_costs(members)
        limit = wave_limit(flights, group.members)
        end = self._range_end(group, members, runnable, costs, limit)
        il_begin, il_end, lookahead, reuse = group.layer_range(n_layer, end)
        if self.runner.two_pass:
            two = self._two_passes_pay(group, members, il_begin, il_end, costs)
            if not two:  # the range was priced with first passes hiding its stalls: price it in one pass
                end = self._range_end(group, members, runnable, costs, limit, self.one_pass_policy)
                il_begin, il_end, lookahead, reuse = group.layer_range(n_layer, end)
            self._set_passes(ctx, two)
        self.calls += 1
        final = il_end == n_layer
        # layers before il_begin + 1 were counted when their experts were revealed; merged ones here
        count_from = 0 if group.layer == FIRST else il_begin + 1
        rows: list[tuple[int, int, int, bool]] = []
        spans: list[tuple[Flight, int, int]] = []
        for f in members:
            start = len(rows)
            for j, tok in enumerate(f.tokens):
                rows.append((tok, f.pos0 + j, f.seq, not final or j == len(f.tokens) - 1))
            spans.append((f, start, len(rows)))
        hidden = None if group.layer == FIRST else [f.h for f in members]
        done = self._decode(ctx, requests, members, rows, hidden, (il_begin, il_end, lookahead, reuse), count_from)
        if done is None:
            return
        start_t, call_t, used_experts, waited_s, landed = done
        elapsed = self._call_s
        decode_rows = sum(len(f.tokens) for f in members if not f.prefill)
        if decode_rows:  # the rate is of decode: a prompt chunk's token-layers are far cheaper
            self.runahead.record(decode_rows * (il_end - il_begin), start_t)
        else:
            self.runahead.exclude(time.perf_counter() - start_t)
        context = sum(pos + 1 for _, pos, _, _ in rows)
        two_pass_layers = self._moe_layers(il_begin, il_end) if self._two_pass_on else 0
        if not self._wide_on:  # the model is of calls on the lane's threads
            self.cost_model.observe(CallShape(layers=il_end - il_begin, tokens=len(rows), experts=used_experts,
                                              context=context, two_pass_layers=two_pass_layers,
                                              loads_beside=landed),
                                    time.perf_counter() - call_t - waited_s)
        if all(f.prefill for f in members):
            stats.prefill_s += elapsed
        if not final:
            h = ctx.hidden(len(rows))
            il, experts = ctx.hook.routed([b for _, _, b in spans], self.cache.layout.top_k)
            if il != il_end:
                raise BevyError(f"the lookahead ran layer {il}, the call asked for {il_end}")
            union = len(set().union(*experts))
            share = union / (len(rows) * self.cache.layout.top_k)
            self._distinct_share += PASS_DECAY * (share - self._distinct_share)
            for (f, a, b), need in zip(spans, experts):
                f.h = h[a:b]
                f.layer = il_end
                f.experts = need  # distinct, ascending
                f.ready, f.counted = False, False
            return
        for f, _, b in spans:
            self._finish_block(ctx, requests, f, b - 1, t0, stats)  # logits of its last row

    def _wave(self, index: int, req: Request, pos0: int) -> list[Flight]:
        """The prompt's chunks from pos0 that prefill together (up to prefill_wave), layer-major:
        each computes a layer after the chunk before it (plan.py), so through a small cache the
        wave loads a layer's experts once instead of once per chunk.

        The wave takes the lane's step clock as its progress: it is as far behind as the most
        lagging decode token, so the decode tokens of that step ride with it layer by layer (one
        call where they fit, as llama-server batches decode tokens with a prompt chunk) and the
        next step's wait for it. So a prompt holds decode by one wave per token, not by the whole
        prompt (a prompt counted from 0 would lead every running request to its end), and the
        lagging-first order stays a step order among requests of any age."""
        chunk = self._wave_chunk(index)
        end = min(len(req.prompt_tokens), pos0 + self.runner.prefill_wave * chunk)
        self._wave_end[index] = end
        final = end == len(req.prompt_tokens)
        return [Flight(index, req.seq, req.prompt_tokens[p: min(p + chunk, end)], p,
                       progress=self._clock, chunk=k, final_wave=final)
                for k, p in enumerate(range(pos0, end, chunk))]

    def _finish_block(self, ctx: Context, requests: dict[int, Request], f: Flight, out_row: int, t0: float,
                      stats: RunStats) -> None:
        """The block passed the last layer: take its output and set up the next block (a prompt
        chunk that is not the prompt's last leaves, and the last of its wave brings the next wave)."""
        req = requests[f.index]
        f.h, f.experts, f.layer = None, (), FIRST
        if f.prefill:
            stats.prefill_tokens += len(f.tokens)
            end = f.pos0 + len(f.tokens)
            if end < len(req.prompt_tokens):  # more prompt chunks
                f.done = True
                if end == self._wave_end[f.index]:
                    self._due_waves.append((f.index, req, end))
                return
            self._wave_end.pop(f.index, None)
        else:
            stats.decode_tokens += 1
        token, margin = req.choose(ctx, out_row)
        req.record(token, margin, self.model.is_eog(token), self.model.piece(token))
        if f.prefill:
            req.ttft_s = time.perf_counter() - t0
        if not req.finished:
            # the next token is a step on (the step clock's unit: one token of every running request)
            f.pos0, f.tokens, f.prefill, f.progress = req.n_past, [req.next_input()], False, f.progress + 1
            f.chunk = 0

    def _retire(self, ctx: Context, requests: dict[int, Request], flights: list[Flight],
                free: list[int]) -> list[Flight]:
        """The flights that go on: finished requests leave (their sequence freed, once, whatever
        chunks of theirs were in flight), and so do prompt chunks whose wave goes on without them."""
        still, gone = [], set()
        for f in flights:
            if f.index in gone or f.done:
                continue
            if requests[f.index].finished:
                gone.add(f.index)
                ctx.seq_rm(f.seq)
                free.append(f.seq)
                free.sort()
                self._wave_end.pop(f.index, None)
                with self.runner._lock:
                    del requests[f.index]
            else:
                still.append(f)
        return still

    def _drop_cancelled(self, ctx: Context, requests: dict[int, Request], flights: list[Flight],
                        free: list[int]) -> list[Flight]:
        """Cancelled requests leave at once, cells of half-computed tokens included."""
        for f in flights:
            if requests[f.index].cancelled and not requests[f.index].finished:
                requests[f.index].fail("cancelled")
        return self._retire(ctx, requests, flights, free)


def in_sequence_order(flights: Iterable[Flight]) -> list[Flight]:
    """A call's flights by sequence id (stable: a prompt's chunks keep their order). With a KV stream
    per sequence llama.cpp splits a batch into one ubatch per run of consecutive sequence ids in
    batch order (llama_batch_allocr::split_equal), and each ubatch computes every layer of the call
    again: ids 3, 0, 1, 2 make two ubatches where 0, 1, 2, 3 make one."""
    return sorted(flights, key=lambda f: f.seq)


def _sum_dicts(parts: list[dict[str, float | int | None]]) -> dict[str, float | int | None]:
    """Key by key: the sum over the lanes (None where no lane measured it)."""
    keys = parts[0].keys() if parts else ()
    return {k: (sum(v for p in parts if (v := p[k]) is not None) if any(p[k] is not None for p in parts) else None)
            for k in keys}
