"""The self-balancing plan as a pure function: given where flights stand, the group formed."""

from __future__ import annotations

from bevy_gguf.engine.plan import FIRST, Flight, Group, PolicyParams, admit_loads, plan

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


def test_lanes_one_per_thread_while_the_cache_serves_each_its_calls_and_reservations() -> None:
    from types import SimpleNamespace

    from bevy_gguf.engine.runners.layers import SelfBalancingRunner

    layout = SimpleNamespace(min_slots=lambda tokens=1, contexts=1: 8 * tokens * contexts)  # top-8

    def lanes(n_threads: int, n_seq: int, n_slots: int, per_lane: int = 1) -> int:
        cache = SimpleNamespace(n_slots=n_slots, layout=layout)
        runner = SelfBalancingRunner(SimpleNamespace(n_layer=8), cache, 8, n_threads, threads_per_lane=per_lane)
        return runner.lanes_for(n_seq)

    assert lanes(2, 8, 512) == 2
    assert lanes(4, 8, 512) == 4
    assert lanes(4, 8, 512, per_lane=2) == 2
    assert lanes(2, 1, 512) == 1  # a single sequence
    assert lanes(4, 8, 40) == 2   # each lane needs 8 slots for its calls and 8 for reservations
    assert lanes(2, 8, 31) == 1   # the minimum cache: one lane, as before
