"""The self-balancing plan as a pure function: given where flights stand, the group formed."""

from __future__ import annotations

import dataclasses
import math

from bevy_gguf.engine.plan import FIRST, Flight, Group, Plan, PolicyParams, admit_loads, nothing_to_share, plan

P = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=False, load_window=0)


def flight(i: int, layer: int, progress: int = 1, experts: tuple[int, ...] = (), ready: bool = True,
           tokens: int = 1, prefill: bool = False) -> Flight:
    return Flight(index=i, seq=i, tokens=[1] * tokens, pos0=0, progress=progress, prefill=prefill, layer=layer,
                  experts=experts, ready=ready)


def test_lagging_ready_flight_chooses_the_layer_and_all_ready_at_it_join() -> None:
    flights = [flight(0, 2, experts=(1,)), flight(1, 1, experts=(2,)), flight(2, 1, experts=(3,)),
               flight(3, 1, experts=(4,), ready=False), flight(4, 0, progress=2, experts=(5,))]
    p = plan(flights, P)
    assert p.group == Group(members=(1, 2), layer=1)  # token 1 lags token 2; flight 3 waits
    assert p.waiting == (3,)


def test_a_blocked_laggard_does_not_hold_back_the_others() -> None:
    flights = [flight(0, 0, progress=1, ready=False), flight(1, 3, progress=1), flight(2, 3, progress=1)]
    assert plan(flights, P).group == Group(members=(1, 2), layer=3)


def test_nothing_ready_means_wait() -> None:
    p = plan([flight(0, 1, ready=False), flight(1, 2, ready=False)], P)
    assert p.group is None and p.waiting == (0, 1)


def test_group_respects_tokens_and_experts() -> None:
    params = PolicyParams(n_layer=4, max_tokens=3, max_experts=4, hold_decode=False)
    flights = [flight(0, 1, experts=(1, 2)), flight(1, 1, experts=(3, 4)), flight(2, 1, experts=(5,)),
               flight(3, 1, experts=(1,), tokens=2)]
    g = plan(flights, params).group
    assert g is not None and g.members == (0, 1)  # flight 2 would make 5 experts, flight 3 4 tokens
    flights[1] = flight(1, 1, experts=(1, 2))
    assert plan(flights, params).group.members == (0, 1, 2)  # now 3 experts and 3 tokens fit


def test_first_blocks_go_first_and_decode_is_held_during_prefill() -> None:
    params = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=True)
    flights = [flight(0, 2, progress=3), flight(1, FIRST, progress=0, tokens=5, prefill=True)]
    assert plan(flights, params).group == Group(members=(1,), layer=FIRST)
    flights = [flight(0, 2, progress=3), flight(1, 2, progress=0, tokens=5, prefill=True, ready=False)]
    assert plan(flights, params).group is None  # the decode waits for the prefill


def test_prefill_first_runs_a_prompts_last_wave_before_the_next_step() -> None:
    """With prefill_first, decode tokens about to start a step wait while a prompt's last wave is
    in flight (its first token does not wait for their step); a wave before the last rides with
    them, and decode tokens already inside a step go on. The held flights are named, so the
    wave's call counts as holding every flight that could run (call_end: a whole step)."""
    params = dataclasses.replace(P, prefill_first=True)
    decode = [flight(0, FIRST, progress=3), flight(1, FIRST, progress=3)]
    last = Flight(index=2, seq=2, tokens=[1] * 5, pos0=0, progress=3, prefill=True, final_wave=True)
    p = plan([*decode, last], params)
    assert p.group == Group(members=(2,), layer=FIRST) and p.held_back == (0, 1)
    assert plan([*decode, last], P).group == Group(members=(0, 1, 2), layer=FIRST)  # off: they ride together
    early = dataclasses.replace(last, final_wave=False)
    p = plan([*decode, early], params)
    assert p.group == Group(members=(0, 1, 2), layer=FIRST) and p.held_back == ()
    inside = [flight(0, 2, progress=3), dataclasses.replace(last, layer=1)]
    assert plan(inside, params).group == Group(members=(1,), layer=1)  # the prompt lags: it goes first
    assert plan(inside, params).held_back == ()


def test_a_prompt_goes_first_only_where_the_decode_tokens_would_share_no_loads_with_it() -> None:
    """prefill_first auto: 8 decode tokens, top-2, 3/4 of their selections distinct (12 experts a
    layer), over 4 MoE layers: first while they would miss under one expert in their step."""
    assert nothing_to_share(8, 2, 0.75, [0.0, 0.0, 0.0, 0.0])  # every expert in: nothing to share
    assert nothing_to_share(8, 2, 0.75, [0.02, 0.02, 0.02, 0.02])  # 0.96 expected misses
    assert not nothing_to_share(8, 2, 0.75, [0.03, 0.02, 0.02, 0.02])  # 1.08: they ride with it
    assert not nothing_to_share(8, 2, 0.75, [1.0] * 4)  # nothing measured yet (misses assumed)
    assert nothing_to_share(0, 2, 0.75, [1.0] * 4)  # no decode token waits


def test_layer_ranges() -> None:
    assert Group((0,), FIRST).layer_range(4) == (0, 0, True, False)
    assert Group((0,), FIRST).layer_range(4, end=4) == (0, 4, False, False)
    assert Group((0,), 1).layer_range(4) == (1, 2, True, True)
    assert Group((0,), 3).layer_range(4) == (3, 4, False, True)
    assert Group((0,), 1).layer_range(4, end=3) == (1, 3, True, True)


def test_loads_go_to_the_front_within_the_cache() -> None:
    flights = [flight(0, 1, progress=1, experts=(1, 2)), flight(1, 2, progress=1, experts=(3,)),
               flight(2, 1, progress=1, experts=(4,)), flight(3, FIRST, progress=0)]
    assert admit_loads(flights, P) == [0, 2]  # the most lagging started flights only
    wide = PolicyParams(n_layer=4, max_tokens=64, max_experts=3, load_window=1)
    assert admit_loads(flights, wide) == [0, 2]  # lagging first; flight 1 would make 4 experts > 3
    wider = PolicyParams(n_layer=4, max_tokens=64, max_experts=4, load_window=1)
    assert admit_loads(flights, wider) == [0, 2, 1]


def test_past_the_front_loads_stay_within_the_budget() -> None:
    # the front (step 1, layer 1) is blocking's batch: admitted whatever the budget; the flights
    # that ran ahead get loads lagging first while the union stays within the budget
    flights = [flight(0, 1, progress=1, experts=(1, 2, 3)), flight(1, 1, progress=1, experts=(3, 4)),
               flight(2, 2, progress=1, experts=(5,)), flight(3, 3, progress=1, experts=(6, 7)),
               flight(4, 0, progress=2, experts=(8,))]
    params = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, load_window=5)
    assert admit_loads(flights, params) == [0, 1, 2, 3, 4]  # no budget: the cache
    assert admit_loads(flights, params, budget=2) == [0, 1]  # the front's 4 alone are over it
    assert admit_loads(flights, params, budget=5) == [0, 1, 2]  # + flight 2's one; flight 3's two would be 7
    assert admit_loads(flights, params, budget=6) == [0, 1, 2, 4]  # flight 3 skipped, flight 4's one fits
    assert admit_loads(flights, params, budget=8) == [0, 1, 2, 3, 4]
    tight = PolicyParams(n_layer=4, max_tokens=64, max_experts=5, load_window=5)
    assert admit_loads(flights, tight, budget=100) == [0, 1, 2]  # the cache bounds the budget


def test_the_lane_budgets_one_batched_visit_of_its_started_flights() -> None:
    from types import SimpleNamespace

    from bevy_gguf.engine.runners.layers import _Lane

    def lane(budget: float) -> SimpleNamespace:
        return SimpleNamespace(runner=SimpleNamespace(load_budget=budget),
                               cache=SimpleNamespace(layout=SimpleNamespace(top_k=8)), _distinct_share=0.5)

    # 7 started tokens (a 4-token chunk and 3 decode tokens) x top-8 x half of them distinct; a new block counts not
    flights = [flight(0, 1, tokens=4, prefill=True), flight(1, 1), flight(2, 2), flight(3, 3), flight(4, FIRST)]
    assert _Lane._load_budget(lane(1.0), flights) == 28
    assert _Lane._load_budget(lane(2.0), flights) == 56
    assert _Lane._load_budget(lane(0.0), flights) is None  # no budget: up to the cache


def test_lanes_as_asked_at_most_one_per_thread_while_the_cache_serves_each_its_calls_and_reservations() -> None:
    from types import SimpleNamespace

    from bevy_gguf.engine.runners.layers import SelfBalancingRunner

    layout = SimpleNamespace(min_slots=lambda tokens=1, contexts=1: 8 * tokens * contexts)  # top-8

    def lanes(n_threads: int, n_seq: int, n_slots: int, asked: int) -> int:
        cache = SimpleNamespace(n_slots=n_slots, min_class_slots=n_slots, layout=layout)
        runner = SelfBalancingRunner(SimpleNamespace(n_layer=8), cache, 8, n_threads, lanes=asked)
        return runner.lanes_for(n_seq)

    assert lanes(2, 8, 512, asked=1) == 1  # the default: one context, every thread
    assert lanes(2, 8, 512, asked=2) == 2
    assert lanes(4, 8, 512, asked=4) == 4
    assert lanes(4, 8, 512, asked=2) == 2
    assert lanes(2, 8, 512, asked=8) == 2  # at most one per thread
    assert lanes(2, 1, 512, asked=2) == 1  # a single sequence
    assert lanes(4, 8, 40, asked=4) == 2   # each lane needs 8 slots for its calls and 8 for reservations
    assert lanes(2, 8, 31, asked=2) == 1   # the minimum cache: one lane, as before


def waiter(i: int, layer: int, eta: float | None, progress: int = 1, held: bool = False) -> Flight:
    f = flight(i, layer, progress=progress, experts=(9,), ready=False)
    f.eta, f.held = eta, held
    return f


def per_flight(seconds: float):  # noqa: ANN201 - a cost model: seconds per flight in the group
    return lambda members: seconds * len(members)


def test_a_group_waits_for_a_flight_whose_loads_land_before_it_would_compute() -> None:
    flights = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), waiter(2, 2, eta=0.001)]
    p = plan(flights, P, per_flight(0.002))  # the group computes 4 ms; the loads land in 1 ms
    assert p.group is None and p.wait_for == (2,) and p.wait_s == 0.001
    assert plan(flights, P).group == Group((0, 1), 2)  # no cost model: what is ready runs


def test_a_flight_whose_loads_take_long_is_left_behind() -> None:
    flights = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), waiter(2, 2, eta=0.05)]
    p = plan(flights, P, per_flight(0.002))
    assert p.group == Group((0, 1), 2) and p.wait_for == ()


def test_waiting_is_for_flights_behind_or_beside_never_ahead() -> None:
    behind = [flight(0, 3, experts=(1,)), waiter(1, 1, eta=0.001)]  # would run first once loaded
    assert plan(behind, P, per_flight(0.01)).wait_for == (1,)
    ahead = [flight(0, 1, experts=(1,)), waiter(1, 3, eta=0.001)]  # would not join, nor go first
    assert plan(ahead, P, per_flight(0.01)).group == Group((0,), 1)
    next_token = [flight(0, 3, progress=1, experts=(1,)), waiter(1, 1, eta=0.001, progress=2)]
    assert plan(next_token, P, per_flight(0.01)).group == Group((0,), 3)


def test_no_wait_for_a_held_flight_an_unadmitted_one_or_with_splitting_forced() -> None:
    for w in (waiter(2, 2, eta=0.001, held=True), waiter(2, 2, eta=None)):
        flights = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), w]
        assert plan(flights, P, per_flight(0.01)).group == Group((0, 1), 2)
    always_split = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=False, split_factor=0)
    flights = [flight(0, 2, experts=(1,)), waiter(1, 2, eta=0.0001)]
    assert plan(flights, always_split, per_flight(0.01)).group == Group((0,), 2)
    unknown = plan(flights, P, lambda members: None)  # the model has seen no call yet
    assert unknown.group == Group((0,), 2)


def test_with_every_flight_ready_the_group_is_the_whole_lane() -> None:
    flights = [flight(i, 2, experts=(i,)) for i in range(4)]
    assert plan(flights, P, per_flight(0.001)).group == Group((0, 1, 2, 3), 2)  # blocking's one batch


def merge(group: Group, n_flights: int, tokens: int, miss: float, load_s: float, max_experts: int = 16,
          overhead_s: float = 0.001, layer_s: float = 0.003, two_pass: bool = False, contention_s: float = 0.0) -> int:
    """call_end with 8 distinct experts a layer; load_s: link seconds per load."""
    from bevy_gguf.engine.plan import MergeCosts, call_end

    params = PolicyParams(n_layer=8, max_tokens=64, max_experts=max_experts, hold_decode=False, two_pass=two_pass)
    costs = MergeCosts(overhead_s=overhead_s, layer_s=layer_s, load_s=load_s, distinct=8, contention_s=contention_s)
    return call_end(group, n_flights, tokens, params, top_k=2, n_expert=16, miss_rate=[miss] * 8, costs=costs)


def test_fast_loads_run_the_whole_step_in_one_call_slow_ones_a_layer_per_call() -> None:
    whole = Group((0, 1, 2, 3), FIRST)  # stopping costs 1 ms of overhead + 3 ms of a layer's compute
    assert merge(whole, 4, tokens=4, miss=0.2, load_s=0.0005) == 8  # 1.6 x 0.5 = 0.8 ms < 4 ms: blocking's step
    assert merge(whole, 4, tokens=4, miss=0.2, load_s=0.01) == 0    # 16 ms stall: stop, let the ready run ahead
    assert merge(Group((0, 1, 2, 3), 2), 4, tokens=4, miss=0.0, load_s=1.0) == 8  # no misses: no stall
    assert merge(Group((0, 1, 2, 3), 2), 4, tokens=4, miss=0.6, load_s=0.0008) == 8  # 4.8 x 0.8 = 3.84 ms
    assert merge(Group((0, 1, 2, 3), 2), 4, tokens=4, miss=0.6, load_s=0.0009) == 3  # 4.32 ms > 4 ms: its own layer


def test_with_two_passes_a_merged_layer_stalls_only_for_what_its_first_pass_does_not_hide() -> None:
    # 0.6 of 8 distinct experts miss: 4.8 loads; the first pass computes 0.4 x 3 ms = 1.2 ms meanwhile
    group = Group((0, 1, 2, 3), 2)
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0009) == 3  # one pass: 4.32 ms > 4 ms, stop
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0009, two_pass=True) == 8  # 3.12 ms < 4 ms: go on
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0012, two_pass=True) == 3  # 4.56 ms left: stop
    # rare misses whose loads the first pass covers: no stall at all
    assert merge(group, 4, tokens=4, miss=0.1, load_s=0.0025, layer_s=0.003, overhead_s=0.0, two_pass=True) == 8


def test_loads_that_take_cpu_from_the_calls_beside_them_keep_the_group_together() -> None:
    # one pass, 4.8 loads of 0.9 ms = 4.32 ms > 4 ms: stop, let the ready run ahead ...
    group = Group((0, 1, 2, 3), 2)
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0009) == 3
    # ... unless each load moving beside a call costs it 0.3 ms: 4 + 1.44 ms > 4.32 ms, runahead hides too little
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0009, contention_s=0.0003) == 8
    # two passes: 3.12 ms left after the first pass, plus its share of the loads' cost (1.2 of 4.32 ms)
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0009, two_pass=True, contention_s=0.0003) == 8
    assert merge(group, 4, tokens=4, miss=0.6, load_s=0.0015, two_pass=True, contention_s=0.0003) == 3


def test_a_call_goes_on_only_for_the_whole_lane_and_only_if_any_layer_fits_the_cache() -> None:
    from bevy_gguf.engine.plan import call_end

    assert merge(Group((0, 1), 2), 4, tokens=2, miss=0.0, load_s=0.0) == 3  # others could run
    assert merge(Group((0, 1, 2, 3), 2), 4, tokens=4, miss=0.0, load_s=0.0, max_experts=7) == 3  # 8 > 7 slots
    params = PolicyParams(n_layer=8, max_tokens=64, max_experts=16, hold_decode=False)
    assert call_end(Group((0,), 5), 1, 1, params, 2, 16, [0.0] * 8, costs=None) == 6  # nothing measured yet
    assert call_end(Group((0,), 5), 1, 1, params, 2, 16, [0.0] * 8, costs=None, merge_misses=2.0) == 8


def test_at_the_minimum_cache_a_call_goes_on_as_blockings_do() -> None:
    """A cache that holds one token's experts (top_k = 2 slots a call) leaves no room for anyone
    to run while a call stalls, so a one-token call goes on through the layers whose stall is
    below a stop's cost, as if it held the whole lane; with room for two tokens' experts, it stops."""
    one = Group((0,), 2)
    assert merge(one, 4, tokens=1, miss=1.0, load_s=0.00005, max_experts=2) == 8  # 0.4 ms < 4 ms
    assert merge(one, 4, tokens=1, miss=1.0, load_s=0.00005, max_experts=4) == 3  # another token fits
    assert merge(one, 4, tokens=1, miss=1.0, load_s=0.001, max_experts=2) == 3  # 8 ms stall: stop


def test_a_merged_call_stops_where_the_chunk_before_a_member_has_still_to_go() -> None:
    """A prompt chunk attends to the chunk before it at every layer, so a call that goes on
    through layers stops at the first layer that chunk has not computed (its router runs there)."""
    from bevy_gguf.engine.plan import MergeCosts, call_end, wave_limit

    chunks = [Flight(index=7, seq=0, tokens=[1], pos0=p, progress=1, layer=layer, chunk=k, ready=True)
              for k, (p, layer) in enumerate([(0, 5), (1, 2), (2, 1)])]
    decode = flight(1, 1)
    flights = chunks + [decode]
    assert wave_limit(flights, (1,)) == 5     # chunk 1: chunk 0 has layers 5.. to go
    assert wave_limit(flights, (2, 3)) == 2   # chunk 2 (with a decode token): chunk 1 is at layer 2
    assert wave_limit(flights, (1, 2)) == 5   # chunk 2 rides with chunk 1 in the call
    assert wave_limit(flights, (0, 3)) is None  # the first chunk, a decode token: nothing before them
    params = PolicyParams(n_layer=8, max_tokens=64, max_experts=2, hold_decode=False)
    costs = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.00005, distinct=2, contention_s=0.0)
    end = call_end(Group((1,), 2), 4, 1, params, 2, 16, [1.0] * 8, costs, limit=5)
    assert end == 5  # on through layers 2-4, then layer 5's router: chunk 0 computes layer 5 first
    assert call_end(Group((1,), 2), 4, 1, params, 2, 16, [1.0] * 8, costs, limit=2) == 3  # its own layer


def test_a_call_never_stops_at_a_dense_layer() -> None:
    """A call ends with the lookahead of the layer it stops at, whose router reveals that layer's
    experts; a dense layer (GLM's, DeepSeek's leading ones) has no router, so the call runs it."""
    from bevy_gguf.engine.plan import call_end

    params = PolicyParams(n_layer=6, max_tokens=64, max_experts=16, hold_decode=False, dense=frozenset({0, 1}))
    # a new token: layers 0 and 1, then layer 2's router
    assert call_end(Group((0,), FIRST), 2, 1, params, 2, 16, [1.0] * 6, costs=None) == 2
    assert call_end(Group((0,), 2), 2, 1, params, 2, 16, [1.0] * 6, costs=None) == 3      # MoE layers: one at a time
    middle = dataclasses.replace(params, dense=frozenset({3, 4}))
    assert call_end(Group((0,), 2), 2, 1, middle, 2, 16, [1.0] * 6, costs=None) == 5
    last = dataclasses.replace(params, dense=frozenset({5}))
    assert call_end(Group((0,), 4), 2, 1, last, 2, 16, [1.0] * 6, costs=None) == 6        # on to the logits


TWO_PASS = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=False, two_pass=True)


def test_with_two_passes_nothing_ready_runs_the_laggard_whose_loads_land_while_it_computes() -> None:
    flights = [waiter(0, 2, eta=0.004), waiter(1, 1, eta=0.003), waiter(2, 1, eta=0.002), waiter(3, 0, eta=None),
               waiter(4, 1, eta=0.009)]
    p = plan(flights, TWO_PASS, per_flight(0.001))  # the three at layer 1 compute 3 ms
    assert p.group == Group((1, 2), 1)  # its call computes what is in and waits in the hook for the rest
    late = [waiter(0, 1, eta=0.02), waiter(1, 2, eta=0.0001)]  # the laggard's loads land long after
    assert plan(late, TWO_PASS, per_flight(0.001)).group is None  # wait for whichever is ready first
    unadmitted = [waiter(0, 2, eta=None), waiter(1, 1, eta=None)]
    assert plan(unadmitted, TWO_PASS, per_flight(0.001)).group is None  # no load under way: wait
    assert plan(flights, TWO_PASS).group is None  # no cost model yet: wait


def test_with_two_passes_a_flight_that_would_be_waited_for_joins_or_goes_first() -> None:
    beside = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), waiter(2, 2, eta=0.001)]
    assert plan(beside, TWO_PASS, per_flight(0.002)) == Plan(Group((0, 1, 2), 2), waiting=(2,))
    behind = [flight(0, 3, experts=(1,)), waiter(1, 1, eta=0.001)]
    assert plan(behind, TWO_PASS, per_flight(0.01)).group == Group((1,), 1)  # lagging first
    late = [flight(0, 2, experts=(1,)), waiter(1, 2, eta=0.05)]  # lands long after the group computes
    assert plan(late, TWO_PASS, per_flight(0.002)).group == Group((0,), 2)
    ahead = [flight(0, 1, experts=(1,)), waiter(1, 3, eta=0.0001)]
    assert plan(ahead, TWO_PASS, per_flight(0.01)).group == Group((0,), 1)


def test_with_two_passes_decode_still_waits_for_prefill() -> None:
    params = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=True, two_pass=True)
    flights = [waiter(0, 2, eta=0.0001), flight(1, 2, progress=0, tokens=5, prefill=True, ready=False)]
    flights[1].eta = 0.0005
    assert plan(flights, params, per_flight(0.001)).group == Group((1,), 2)  # the prefill, not the decode


def test_two_passes_run_where_their_hidden_stall_pays_for_the_second_pass() -> None:
    from bevy_gguf.engine.plan import MergeCosts, two_pass_pays

    costs = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.001, distinct=8)
    layers = range(0, 4)
    # nothing measured: two passes (never wrong)
    assert two_pass_pays(layers, [0.0] * 4, None, 1e-4)
    assert two_pass_pays(layers, [0.0] * 4, costs, None)
    # nothing misses (a cache that holds the working set): one pass, the second would only cost
    assert not two_pass_pays(layers, [0.0] * 4, costs, 1e-4)
    # rare misses: 0.01 x 8 = 0.08 loads expected per layer, x 1 ms, all under the first pass
    assert not two_pass_pays(layers, [0.01] * 4, costs, 1e-4)
    assert two_pass_pays(layers, [0.01] * 4, costs, 5e-5)
    # frequent misses: the first pass covers (1 - 0.5) x 3 ms of the 4 ms of loads per layer
    assert two_pass_pays(layers, [0.5] * 4, costs, 1e-3)
    assert not two_pass_pays(layers, [0.5] * 4, costs, 2e-3)


def test_a_second_pass_does_not_pay_where_the_loads_beside_it_cost_what_they_hide() -> None:
    from bevy_gguf.engine.plan import MergeCosts, two_pass_pays

    layers = range(0, 4)
    # a fast link: 0.25 x 8 = 2 loads per layer of 0.1 ms each, all of it under the first pass
    fast = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.0001, distinct=8)
    assert two_pass_pays(layers, [0.25] * 4, fast, 1e-4)  # hides 0.2 ms for 0.1 ms
    taxed = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.0001, distinct=8, contention_s=0.00008)
    assert not two_pass_pays(layers, [0.25] * 4, taxed, 1e-4)  # 0.2 - 2 x 0.08 = 0.04 ms < 0.1
    # a slow link: the same tax is small beside what the first pass covers (2.25 ms of 8 ms of loads)
    slow = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.004, distinct=8, contention_s=0.00008)
    assert two_pass_pays(layers, [0.25] * 4, slow, 1e-3)


def test_a_calls_own_pending_loads_buy_two_passes_only_when_the_first_pass_hides_more_than_they_cost() -> None:
    from bevy_gguf.engine.plan import MergeCosts, PendingLoads, two_pass_pays

    costs = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.001, distinct=8, contention_s=0.00001)
    nothing_after = range(3, 3)  # the call's own layer (2) and the next, whose experts are known to miss nothing
    # two loads landing in 2 ms, 6 of 8 experts in: the first pass covers 2 ms (of its 2.25), less 2 x 10 us
    slow = PendingLoads(seconds=0.002, loads=2, resident=0.75)
    assert two_pass_pays(nothing_after, [0.0] * 8, costs, 1e-4, moe_layers=8, pending=slow)  # 1.98 ms > 0.8 ms
    assert not two_pass_pays(nothing_after, [0.0] * 8, costs, 3e-4, moe_layers=8, pending=slow)  # < 2.4 ms
    # one load landing in 50 us: a whole-step call (8 MoE layers) would pay 8 second passes to hide 40 us
    quick = PendingLoads(seconds=0.00005, loads=1, resident=0.875)
    assert not two_pass_pays(nothing_after, [0.0] * 8, costs, 2e-5, moe_layers=8, pending=quick)
    assert two_pass_pays(nothing_after, [0.0] * 8, costs, 2e-5, moe_layers=1, pending=quick)  # a one-layer call
    # loads whose landing is not known: what the first pass computes is what it can hide
    unknown_eta = PendingLoads(seconds=math.inf, loads=4, resident=0.5)
    assert two_pass_pays(nothing_after, [0.0] * 8, costs, 1e-4, moe_layers=8, pending=unknown_eta)  # 1.5 ms
    # nothing pending: the own layer counts only as a cost
    assert not two_pass_pays(nothing_after, [0.0] * 8, costs, 1e-6, moe_layers=1, pending=None)


WHOLE = PolicyParams(n_layer=4, max_tokens=64, max_experts=16, hold_decode=False, keep_whole=True)


def test_without_runahead_a_group_waits_for_every_flight_at_its_layer_or_behind_however_late() -> None:
    flights = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), waiter(2, 2, eta=5.0)]
    assert plan(flights, P, per_flight(0.002)).group == Group((0, 1), 2)  # with runahead: left behind
    p = plan(flights, WHOLE, per_flight(0.002))
    assert p.group is None and p.wait_for == (2,) and p.wait_s == 5.0
    assert plan(flights, WHOLE).wait_for == (2,)  # with no cost model yet, too
    ahead = [flight(0, 1, experts=(1,)), waiter(1, 3, eta=0.5)]  # ahead: the laggard runs (and catches up)
    assert plan(ahead, WHOLE, per_flight(0.01)).group == Group((0,), 1)
    held = [flight(0, 2, experts=(1,)), waiter(1, 2, eta=0.5, held=True)]  # waited for once: go on
    assert plan(held, WHOLE, per_flight(0.01)).group == Group((0,), 2)


def test_without_runahead_two_passes_run_the_group_whole_its_loading_flights_in_it() -> None:
    import dataclasses

    whole = dataclasses.replace(TWO_PASS, keep_whole=True)
    beside = [flight(0, 2, experts=(1,)), flight(1, 2, experts=(2,)), waiter(2, 2, eta=5.0)]
    assert plan(beside, TWO_PASS, per_flight(0.002)).group == Group((0, 1), 2)
    assert plan(beside, whole, per_flight(0.002)).group == Group((0, 1, 2), 2)  # its call waits in the hook
    stalled = [waiter(0, 1, eta=5.0), waiter(1, 1, eta=0.1), waiter(2, 2, eta=0.0)]
    assert plan(stalled, TWO_PASS, per_flight(0.001)).group is None
    assert plan(stalled, whole, per_flight(0.001)).group == Group((0, 1), 1)  # as blocking: stall in the call


def test_with_runahead_measured_to_pay_a_call_stops_where_its_stall_is_above_a_calls_cost() -> None:
    from bevy_gguf.engine.plan import MergeCosts, call_end

    params = PolicyParams(n_layer=8, max_tokens=64, max_experts=16, hold_decode=False)
    costs = MergeCosts(overhead_s=0.001, layer_s=0.003, load_s=0.0003, distinct=8)
    whole = Group((0, 1, 2, 3), 2)
    # 0.6 x 8 loads x 0.3 ms = 1.44 ms stall: under a call and a layer (4 ms), above a call (1 ms)
    assert call_end(whole, 4, 4, params, 2, 16, [0.6] * 8, costs) == 8
    assert call_end(whole, 4, 4, params, 2, 16, [0.6] * 8, costs, runahead=True) == 3
    assert call_end(whole, 4, 4, params, 2, 16, [0.1] * 8, costs, runahead=True) == 8  # 0.24 ms: go on
    assert call_end(whole, 4, 4, params, 2, 16, [0.6] * 8, costs, merge_misses=float("inf")) == 8  # whole


def chunk(request: int, k: int, layer: int, ready: bool = True) -> Flight:
    """Chunk k of request's prompt wave, at layer."""
    return Flight(index=request, seq=request, tokens=[1] * 4, pos0=4 * k, progress=0, prefill=True, layer=layer,
                  ready=ready, chunk=k)


def test_a_prompt_wave_runs_layer_major_each_chunk_behind_the_one_before_it() -> None:
    params = dataclasses.replace(P, two_pass=True)
    for p in (P, params):
        # chunk 1 may compute layer 1 (chunk 0 is past it); chunk 2 waits until chunk 1 is past layer 1
        flights = [chunk(0, 0, 2), chunk(0, 1, 1), chunk(0, 2, 1)]
        assert plan(flights, p).group == Group(members=(1,), layer=1)
        # a new wave's chunks start one after another: only the first may embed now
        flights = [chunk(0, 0, FIRST), chunk(0, 1, FIRST), chunk(0, 2, FIRST)]
        assert plan(flights, p).group == Group(members=(0,), layer=FIRST)
        # a chunk whose predecessor has left (past the last layer) is free; another request's chunk joins it
        flights = [chunk(0, 3, 0), chunk(1, 0, 0)]
        assert plan(flights, p).group == Group(members=(0, 1), layer=0)
    # a chunk that waits for the one before it is neither run nor waited for, loading or not
    flights = [chunk(0, 0, 1, ready=False), chunk(0, 1, 1, ready=False)]
    flights[0].eta = flights[1].eta = 0.001
    assert plan(flights, P).waiting == (0,)
    assert plan(flights, params, cost=lambda members: 1.0).group == Group(members=(0,), layer=1)
