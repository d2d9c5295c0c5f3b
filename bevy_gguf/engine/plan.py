"""The self-balancing scheduler's plan: which requests compute which layer next.

Every request in flight decodes a block of tokens (a prompt chunk, or one token) layer by
layer. After each layer-range call the block stands before a layer whose experts it has just
revealed (the router lookahead); it is ready when they are loaded. The policy (`plan`) is pure:
given where the flights stand, it returns the group to run next, vLLM-style.

Policy (parameters in PolicyParams):
- lagging first: the ready flight furthest behind (fewest tokens decoded, then lowest layer)
  chooses the layer; the group is every ready flight at that layer, lagging first, as long as
  the group's tokens fit one call (max_tokens) and its experts fit the cache (max_experts);
- loads go to the front: only flights within load_window layers of the most lagging flight
  have their experts loaded (and held); flights further ahead run only on experts that are
  resident anyway, so running ahead never costs link bytes (when the link is the limit, bytes
  are what decide), and the front is never starved;
- split or wait (with a cost model): a group leaves behind the flights whose loads have not
  landed; when the loads of such a flight (at the group's layer, or further behind) land
  sooner than the group would compute, splitting costs more than it hides (the flight would
  later run its layers alone, reading again the experts the group read), so the plan waits
  for it instead. With no misses, or misses that land fast, the flights stay together (as
  blocking's one batch); a flight whose loads take long is left behind, and the others run ahead;
- a group that holds every flight (nobody could run while it stalls) extends its call through
  the following layers whose expected stall costs less than one more call (the runner decides
  it, see layers.py): with fast loads or rare misses, whole steps run in one call, as in the
  batched runner;
- with `hold_decode`, no flight decodes a generated token while another still prefills (so
  the phases separate, as in the batched runner);
- a prompt prefills in waves of chunks, layer-major: a chunk computes a layer only once the
  chunk before it (same request) is past that layer (its attention there, which the chunk attends
  to, is written), so the wave's chunks pass each layer one after another and its experts load
  once for the wave instead of once per chunk (`_chunk_blocked`);
- nothing ready: wait for a load (Plan.group is None);
- with two passes per MoE layer (`two_pass`, patch 0004) a flight whose loads are under way can
  run (its call computes the experts that are in while the rest land, then waits in the hook for
  those): the flight a one-pass plan would wait for joins the group (beside it) or goes first
  (behind it), and with nothing ready the most lagging flight runs if its loads land within
  what its group computes meanwhile (else the lane waits for a load, as without two passes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

FIRST = -1  # a block not started yet: its first call embeds it and runs layer 0's attention and router


@dataclass(slots=True)
class Flight:
    """A request in flight: the block it decodes now and where that block stands."""

    index: int                       # the request's index
    seq: int                         # its sequence id in the context
    tokens: list[int]                # the block: a prompt chunk or one token
    pos0: int                        # position of the block's first token
    progress: int = 0                # the step its block belongs to (tokens, lagging first; layers.py)
    prefill: bool = True             # the block is (part of) the prompt
    layer: int = FIRST               # the layer the block computes next
    experts: tuple[int, ...] = ()    # distinct experts that layer needs (from the lookahead)
    ready: bool = True               # those experts are loaded
    counted: bool = True             # its lookups were counted (once per revealed layer)
    eta: float | None = 0.0          # seconds until its loads land (0: ready; None: nothing loads for it)
    missing: int = 0                 # of its experts, those not in (0: ready)
    held: bool = False               # a plan already waited for it past its eta: do not wait again
    chunk: int = 0                   # a prompt chunk's place in its wave (the chunk before it goes first)
    final_wave: bool = False         # a prompt chunk of the wave that ends its prompt (its first token)
    done: bool = False               # a prompt chunk past the last layer whose wave goes on: it leaves
    h: np.ndarray | None = field(default=None, repr=False)  # [tokens, n_embd] entering `layer`

    @property
    def lag(self) -> tuple[int, int]:
        return self.progress, self.layer

    def depth(self, n_layer: int) -> int:
        """Layers computed so far, over all its tokens (FIRST counts as the start of a token)."""
        return self.progress * (n_layer + 1) + self.layer + 1


@dataclass(frozen=True, slots=True)
class Group:
    """One llama_decode_layers call: these flights, at this layer."""

    members: tuple[int, ...]  # indices into the flight list
    layer: int                # FIRST or 0..n_layer-1

    def layer_range(self, n_layer: int, end: int | None = None) -> tuple[int, int, bool, bool]:
        """(il_begin, il_end, lookahead, reuse) of the call: full layers up to `end` (default:
        the group's layer alone), then the lookahead of layer `end` unless it is the last."""
        begin = 0 if self.layer == FIRST else self.layer
        if end is None:
            end = 0 if self.layer == FIRST else self.layer + 1
        return begin, end, end < n_layer, self.layer != FIRST


@dataclass(frozen=True, slots=True)
class Plan:
    group: Group | None             # None: wait for a load
    waiting: tuple[int, ...] = ()   # flights whose experts are not loaded yet
    wait_for: tuple[int, ...] = ()  # the flights a wait with a group ready holds for (their loads land soon)
    wait_s: float | None = None     # how long at most (None: until a load lands)
    held_back: tuple[int, ...] = ()  # flights that may not run now (hold_decode, prefill_first)


@dataclass(frozen=True, slots=True)
class PolicyParams:
    n_layer: int
    max_tokens: int           # tokens per call (the context's batch)
    max_experts: int          # distinct experts one call may pin (the cache's slots)
    hold_decode: bool = True  # no generated token decodes while a prompt still prefills
    load_window: int = 0      # layers ahead of the most lagging flight whose loads are started
                              # (the runner's default: n_layer + 1, one token)
    split_factor: float = 1.0  # wait for a flight whose loads land within this many times the
                               # group's predicted compute (0: never wait, run what is ready)
    two_pass: bool = False     # MoE layers compute their loaded experts while the others load (patch
                               # 0004): a flight whose loads are under way may run; its call waits for them
    keep_whole: bool = False   # no runahead (runahead.py): wait for every flight whose loads are under way
                               # (at the group's layer or behind), however long they take
    prefill_first: bool = False  # a prompt's last wave goes through the layers before the decode tokens
                                 # waiting to start a step (as llama-server and blocking prefill a joining
                                 # prompt before the next decode step): its first token does not wait for it
    dense: frozenset[int] = frozenset()  # layers without routed experts (GLM's and DeepSeek's leading
                                         # dense layers): no router, so a call never stops at one


Cost = Callable[[list[Flight]], float | None]  # predicted compute seconds of a group of flights (None: unknown)


def plan(flights: list[Flight], params: PolicyParams, cost: Cost | None = None) -> Plan:
    """The next group to run (lagging first), or a wait: because nothing is ready, or because
    (with a cost model) the group would leave behind a flight whose loads land sooner than the
    group computes. With two passes a wait becomes a call: see _plan_two_pass."""
    held = _held(flights, params)
    held_back = tuple(sorted(held))
    blocked = _chunk_blocked(flights)
    eligible = [i for i, f in enumerate(flights) if f.ready and i not in held and i not in blocked]
    waiting = tuple(i for i, f in enumerate(flights) if not f.ready and i not in blocked)
    if params.two_pass:
        return replace(_plan_two_pass(flights, params, cost, held, eligible, waiting), held_back=held_back)
    if not eligible:
        return Plan(None, waiting, held_back=held_back)
    lead = min(eligible, key=lambda i: flights[i].lag)
    layer = flights[lead].layer
    members = _members(flights, eligible, layer, params)
    group = Group(tuple(members), layer)
    limit = _wait_limit(flights, members, params, cost)
    if limit is not None:
        soon = tuple(i for i in waiting if _worth_waiting(flights[i], flights[lead], layer, i in held)
                     and flights[i].eta <= limit)
        if soon:
            return Plan(None, waiting, wait_for=soon, wait_s=max(flights[i].eta for i in soon), held_back=held_back)
    return Plan(group, waiting, held_back=held_back)


def nothing_to_share(decode_tokens: int, top_k: int, distinct_share: float, miss_rates: list[float]) -> bool:
    """Whether decode tokens about to start a step would miss fewer than one expert over it: their
    expected union per layer (tokens x top_k x the share of selections that are distinct), times
    each MoE layer's miss rate, summed. Then riding with a prompt's last wave shares no loads with
    it, and the wave may go first (prefill_first auto), so its first token does not wait for their
    step (blocking's and llama-server's order); where they would miss, they ride with it and share
    its loads (measured on the default model at 25% and 50%: the wave first cost 0.94x the tok/s,
    docs/architecture.md)."""
    return decode_tokens * top_k * distinct_share * sum(miss_rates) < 1.0


def _held(flights: list[Flight], params: PolicyParams) -> set[int]:
    """Flights that may not run now: with hold_decode every decode token while a prompt prefills;
    with prefill_first the decode tokens about to start a step while a prompt's last wave is in
    flight (a wave before it rides with them: a long prompt holds decode one wave at a time)."""
    if params.hold_decode and any(f.prefill for f in flights):
        return {i for i, f in enumerate(flights) if not f.prefill}
    if params.prefill_first and any(f.prefill and f.final_wave for f in flights):
        return {i for i, f in enumerate(flights) if not f.prefill and f.layer == FIRST}
    return set()


def _chunk_blocked(flights: list[Flight]) -> set[int]:
    """Prompt chunks that wait for the chunk before them: it is still in flight at their layer or
    behind (a chunk attends to the one before it at every layer it computes; the call of a chunk
    that is not the whole lane covers one layer and the next one's attention, which the chunk
    before has written once it is past that layer)."""
    at = _chunk_layers(flights)
    return {i for i, f in enumerate(flights)
            if f.prefill and f.chunk > 0 and at.get((f.index, f.chunk - 1), math.inf) <= f.layer}


def _chunk_layers(flights: list[Flight]) -> dict[tuple[int, int], int]:
    """The layer each prompt chunk in flight computes next, by (request index, chunk)."""
    return {(f.index, f.chunk): f.layer for f in flights if f.prefill}


def _wait_limit(flights: list[Flight], members: list[int], params: PolicyParams, cost: Cost | None) -> float | None:
    """How soon a flight's loads must land for the group to wait for it: split_factor times the
    group's predicted compute (None: never wait; no cost model, or a split factor of 0), or
    without runahead (keep_whole) however long they take."""
    if params.keep_whole:
        return math.inf
    if cost is None or params.split_factor <= 0:
        return None
    predicted = cost([flights[i] for i in members])
    return None if predicted is None else params.split_factor * predicted


def _plan_two_pass(flights: list[Flight], params: PolicyParams, cost: Cost | None, held: set[int],
                   eligible: list[int], waiting: tuple[int, ...]) -> Plan:
    """With two passes a flight whose loads are under way can run: its call computes the experts
    that are in while the others land, and waits in the hook only for what is left. So where the
    one-pass plan would wait (for a flight whose loads land sooner than the group computes, or
    because nothing is ready), this one runs that flight: beside the group it joins it, behind it
    its own layer goes first (lagging first), and with nothing ready the most lagging flight runs
    with the flights at its layer whose loads land within what they compute meanwhile. Otherwise
    the lane waits for a load (a call waiting long in the hook would hold back a flight that
    becomes ready sooner, and the next experts it would reveal to the link)."""
    loading = [i for i in waiting if flights[i].eta is not None and flights[i].layer != FIRST and i not in held]
    if not eligible:
        # nothing ready: the most lagging flight runs if its loads land within what its group
        # computes meanwhile (a call waiting longer in the hook would keep the lane from running
        # whichever flight is ready first, and from revealing its next experts to the link)
        if not loading:
            return Plan(None, waiting)
        lead = min(loading, key=lambda i: flights[i].lag)
        layer = flights[lead].layer
        limit = _wait_limit(flights, _members(flights, loading, layer, params), params, cost)
        if limit is None:
            return Plan(None, waiting)
        soon = [i for i in loading if flights[i].eta <= limit]
        if lead not in soon:
            return Plan(None, waiting)
        return Plan(Group(tuple(_members(flights, soon, layer, params)), layer), waiting)
    lead = min(eligible, key=lambda i: flights[i].lag)
    layer = flights[lead].layer
    members = _members(flights, eligible, layer, params)
    limit = _wait_limit(flights, members, params, cost)
    if limit is not None:
        soon = [i for i in waiting if _worth_waiting(flights[i], flights[lead], layer, i in held)
                and flights[i].eta <= limit]
        if soon:  # the flights a one-pass plan would wait for run now: beside the group, or first
            candidates = eligible + soon
            layer = flights[min(candidates, key=lambda i: flights[i].lag)].layer
            members = _members(flights, candidates, layer, params)
    return Plan(Group(tuple(members), layer), waiting)


def _members(flights: list[Flight], candidates: list[int], layer: int, params: PolicyParams) -> list[int]:
    """The candidates at `layer`, lagging first, while their tokens fit one call and their
    experts the cache."""
    members: list[int] = []
    tokens = 0
    experts: set[int] = set()
    for i in sorted((i for i in candidates if flights[i].layer == layer), key=lambda i: flights[i].lag):
        f = flights[i]
        union = experts | set(f.experts)
        if members and (tokens + len(f.tokens) > params.max_tokens or len(union) > params.max_experts):
            continue
        members.append(i)
        tokens += len(f.tokens)
        experts = union
    return members


def _worth_waiting(f: Flight, lead: Flight, layer: int, held: bool) -> bool:
    """Would f join the group (its layer), or run before it (further behind), once loaded?"""
    if f.eta is None or f.held or f.layer == FIRST or held:
        return False
    return f.layer == layer or f.lag < lead.lag


def admit_loads(flights: list[Flight], params: PolicyParams, budget: int | None = None) -> list[int]:
    """Flights whose experts may be loaded (and held) now: those within load_window layers of
    the most lagging flight, lagging first, while the union of what they need fits the cache
    (so loads never evict each other in a loop) and, past the front (the flights at the most
    lagging one's step and layer, which blocking would run as one batch), `budget` distinct
    experts (None: the cache). Flights that run ahead at other layers each need experts of their
    own, so without a budget their loads together pin and evict what the front needs next
    (measured on the default model at a 25% cache, 2 threads: runahead loaded 1.55x blocking's bytes
    without a budget, 1.04x with one of one batched visit)."""
    started = [i for i, f in enumerate(flights) if f.layer != FIRST]
    if not started:
        return []
    front = min(flights[i].depth(params.n_layer) for i in started)
    front_lag = min(flights[i].lag for i in started)
    admitted: list[int] = []
    wanted: set[tuple[int, int]] = set()
    for i in sorted(started, key=lambda i: flights[i].lag):
        if flights[i].depth(params.n_layer) > front + params.load_window:
            break
        need = {(flights[i].layer, e) for e in flights[i].experts}
        union = wanted | need
        limit = params.max_experts if budget is None or flights[i].lag == front_lag else min(
            budget, params.max_experts)
        if len(union) <= limit:
            wanted = union
            admitted.append(i)
    return admitted


@dataclass(frozen=True, slots=True)
class MergeCosts:
    """What a lane measured that decides how far a call goes (see call_end)."""

    overhead_s: float  # one more call: the cost model's fixed and per-layer cost, and the lane's Python per pass
    layer_s: float     # the group's compute of one layer, as the cost model predicts it
    load_s: float      # link seconds per expert load: recent link busy time / loads, so with its
                       # workers overlapping as they did (a lone load's latency when loads come
                       # one at a time, bytes / bandwidth when they queue)
    distinct: float    # the group's distinct experts at a layer (expected)
    contention_s: float = 0.0  # compute seconds a load moving while a call computes adds to it
                               # (calibrate.time_step_costs: a link that copies through the CPU)


def call_end(group: Group, n_flights: int, tokens: int, params: PolicyParams, top_k: int, n_expert: int,
             miss_rate: list[float], costs: MergeCosts | None, merge_misses: float | None = None,
             runahead: bool = False, limit: int | None = None) -> int:
    """Where a group's call stops (_call_end), moved past dense layers: a call ends with the
    lookahead of the layer it stops at, whose router reveals that layer's experts, and a dense
    layer has none (a call that would stop there runs it and stops at the next MoE layer).
    limit (wave_limit): the layer a member's chunk before it has not yet computed; the call
    goes on no further than that layer's router (its attention needs the chunk before)."""
    end = _call_end(group, n_flights, tokens, params, top_k, n_expert, miss_rate, costs, merge_misses, runahead)
    while end < params.n_layer and end in params.dense:
        end += 1
    return end if limit is None else max(own_end(group), min(end, limit))


def own_end(group: Group) -> int:
    """Where a call that stops after the group's own layer ends: the first layer whose experts
    are not known yet (layer 0 for a new block)."""
    return 0 if group.layer == FIRST else group.layer + 1


def wave_limit(flights: list[Flight], members: tuple[int, ...]) -> int | None:
    """The lowest layer that the chunk before one of the members (a prompt chunk of the same
    wave, outside the group) has still to compute: a merged call stops there (None: none)."""
    inside = {(flights[i].index, flights[i].chunk) for i in members}
    at = _chunk_layers(flights)
    limits = [at[key] for i in members if flights[i].prefill and flights[i].chunk > 0
              and (key := (flights[i].index, flights[i].chunk - 1)) in at and key not in inside]
    return min(limits) if limits else None


def _call_end(group: Group, n_flights: int, tokens: int, params: PolicyParams, top_k: int, n_expert: int,
              miss_rate: list[float], costs: MergeCosts | None, merge_misses: float | None,
              runahead: bool) -> int:
    """Where a group's call stops (the il_end of llama_decode_layers): right after its own layer,
    or, when nobody could run while it stalls (the group holds every flight of its lane, or a
    call may pin less than two tokens' experts: at the minimum cache no other token's experts
    fit beside a call's, so stopping overlaps nothing, as in blocking's schedule) and any layer's
    experts for its tokens fit the cache at once, on through each following layer whose expected
    stall is below what stopping there would cost.

    A call that goes on stalls in the hook for that layer's misses (their loads start as its
    router runs, as they would after a stopped call's lookahead). A call that stops costs one more
    call (overhead_s), and what it buys is runahead: the flights whose experts are in compute while
    the others' load, which hides at most the stall, and no more than the group's compute of a
    layer could fill (when the loads land sooner than that, the flights were better kept
    together), and the loads that then move beside other calls take contention_s each from them.
    So the call goes on while stall < overhead_s + layer_s + contention_s x misses, the stall
    being the layer's recent miss rate x the group's distinct experts x load_s; with two passes
    per MoE layer (params.two_pass) the layer's first pass computes its resident experts while
    those load, so the stall is what is left of the loads after that pass (the resident share of
    layer_s), plus what the loads moving beside it take from it.
    Fast loads or rare misses: whole steps in one call (blocking's schedule); slow loads: one
    layer per call. Nothing measured yet (costs None): one layer.
    merge_misses (if given) replaces the cost rule by a fixed bound on the expected misses
    (recent miss rate x tokens x top_k). With `runahead` (runahead.py measured that splitting
    pays) a stop is priced at its own cost alone (a call, and the loads' contention): the call
    stops before every layer whose expected stall is above that."""
    end = own_end(group)
    alone = len(group.members) == n_flights or params.max_experts < 2 * top_k  # no two tokens' experts fit
    if not alone or min(n_expert, tokens * top_k) > params.max_experts:
        return end
    if merge_misses is not None:
        while end < params.n_layer and miss_rate[end] * tokens * top_k < merge_misses:
            end += 1
        return end
    if costs is None:
        return end
    while end < params.n_layer and _merged_stall(miss_rate[end], costs, params.two_pass) < _stop_cost(
            miss_rate[end], costs, runahead):
        end += 1
    return end


def _stop_cost(miss: float, costs: MergeCosts, runahead: bool = False) -> float:
    """What stopping before a layer missing this share of lookups costs: one more call, the
    group's compute of a layer that runahead must fill before it hides anything (unless runahead
    is known to pay), and what the layer's loads take from the calls they then move beside
    (contention_s each)."""
    fill = 0.0 if runahead else costs.layer_s
    return costs.overhead_s + fill + costs.contention_s * miss * costs.distinct


def _loads_s(miss: float, costs: MergeCosts) -> float:
    """How long a layer missing this share of lookups loads, expected: its misses x link time each."""
    return miss * costs.distinct * costs.load_s


def _first_pass_s(miss: float, costs: MergeCosts) -> float:
    """What a layer's first pass computes while its loads go on: the resident share of the layer."""
    return (1.0 - miss) * costs.layer_s


def _overlap_cost(miss: float, costs: MergeCosts) -> float:
    """What a layer's first pass pays for the loads that move beside it: contention_s per load,
    for the share of the loads that lands while it computes."""
    loads_s = _loads_s(miss, costs)
    moving = min(1.0, _first_pass_s(miss, costs) / loads_s) if loads_s > 0 else 0.0
    return costs.contention_s * miss * costs.distinct * moving


def _merged_stall(miss: float, costs: MergeCosts, two_pass: bool) -> float:
    """The expected wait of a call that goes on through a layer missing this share of lookups:
    its loads, less (with two passes) the first pass over the resident share, which then pays
    for the loads that move beside it."""
    loads_s = _loads_s(miss, costs)
    if not two_pass:
        return loads_s
    return max(0.0, loads_s - _first_pass_s(miss, costs)) + _overlap_cost(miss, costs)


@dataclass(frozen=True, slots=True)
class PendingLoads:
    """What a call's own layer still waits for as the call starts (its members' loads under way)."""

    seconds: float   # until the last of them lands (the members' eta; inf: not known)
    loads: int       # experts not in yet
    resident: float  # share of the layer's experts that are in (what its first pass computes)


def two_pass_pays(unknown: range, miss_rate: list[float], costs: MergeCosts | None, pass_overhead_s: float | None,
                  moe_layers: int | None = None, pending: PendingLoads | None = None) -> bool:
    """Should a call compute its MoE layers in two passes? The setting holds for the whole call
    (the graph is built with or without them), so a second pass costs each of its moe_layers
    (default: the unknown ones) pass_overhead_s (its extra graph nodes, measured with every
    expert in, see calibrate.time_step_costs, or fitted on real calls, cost_model). What it buys
    is the part of a layer's stall that the first pass over the resident experts covers, less
    what the loads moving beside that pass take from it (contention_s each: on a link that
    copies through the CPU, a fast link's loads cost the compute about what they would have
    stalled it): at the call's own layer, the pending loads (known: their eta), and at the
    layers after it whose experts are not known yet (`unknown`), the expected loads. Two passes
    when that hidden stall is above what the second passes cost. So a call whose own loads land
    within microseconds no longer pays a second pass on every layer of a whole step (measured
    before: at 90% cache bevy with two passes 0.95x bevy with one). Nothing measured yet (costs
    or the overhead None): two passes, which are never wrong, only slower where nothing misses."""
    if costs is None or pass_overhead_s is None:
        return True
    hidden = 0.0
    if pending is not None and pending.loads > 0:
        first = pending.resident * costs.layer_s
        landing = min(1.0, first / pending.seconds) if pending.seconds > 0 else 1.0
        hidden += max(0.0, min(pending.seconds, first) - costs.contention_s * pending.loads * landing)
    for il in unknown:
        covered = min(_loads_s(miss_rate[il], costs), _first_pass_s(miss_rate[il], costs))
        hidden += max(0.0, covered - _overlap_cost(miss_rate[il], costs))
    return hidden > pass_overhead_s * (len(unknown) if moe_layers is None else moe_layers)
