"""libbevy's bindings: the ABI check, typed handles, return values, and the hook's mechanism
(routed experts per group, the state a failed call leaves)."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import numpy as np
import pytest

from bevy_gguf._native import libbevy as native
from bevy_gguf._native.bevy_handles import Hook, Link, RouterTrace
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model


def test_structs_and_constants_agree_with_the_library_and_a_wrong_one_is_named() -> None:
    assert native.abi_mismatches(native.STRUCTS, native._CONSTANTS) == []
    assert [f for f, _ in native.BevyCounters._fields_][:3] == ["hits", "misses", "loads"]
    assert native.bevy_abi(b"sizeof:bevy_counters") == 8 * len(native.BevyCounters._fields_)
    assert native.bevy_abi(b"no such thing") == -1

    class Shifted(ctypes.Structure):  # bevy_event with its fields in the wrong order
        _fields_ = [("context", ctypes.c_int32), ("kind", ctypes.c_int32), ("layer", ctypes.c_int32),
                    ("expert", ctypes.c_int32), ("t0_ns", ctypes.c_int64), ("t1_ns", ctypes.c_int64)]

    wrong = native.abi_mismatches({"bevy_event": Shifted}, {"BEVY_POLICY_LRU": 7})
    assert wrong == ["BEVY_POLICY_LRU", "bevy_event.context", "bevy_event.kind"]


def test_handles_are_typed(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 4096)
    link = Link.file(blob)
    with pytest.raises(ctypes.ArgumentError):
        native.bevy_cache_pinned(link.handle)  # a link where a cache goes
    with pytest.raises(ctypes.ArgumentError):
        native.bevy_link_bounced(12345)  # a bare address
    assert "file" in link.describe() and not link.emulated()
    link.close()
    link.close()  # freed once


@pytest.fixture()
def cache4(qwen3_tiny: Path) -> ExpertCache:
    """4 slots over the tiny model (2 layers of 8 experts, top-2), from a RAM copy."""
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 4 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram")) as cache:
        yield cache


def moe_call(ids: list[list[int]], il: int, route_only: bool = False, n_out_max: int = 4, pass_: int = 0,
             batch_rows: list[int] | None = None, n_batch_rows: int = 0, batch_seq: int = 0
             ) -> tuple[native.BevyMoeCall, ctypes.Array]:
    """A bevy_moe_call as the patched graph makes one: rows of k selected ids at layer il (pass_:
    0 one pass, 1 and 2 the two passes of patch 0004; batch_rows: each row's place in its batch,
    patch 0011), and the out array it points at."""
    k = len(ids[0])
    flat = (ctypes.c_int32 * (len(ids) * k))(*(e for row in ids for e in row))
    out = (ctypes.c_int32 * (len(ids) * k))()
    rows = (ctypes.c_int32 * len(batch_rows))(*batch_rows) if batch_rows is not None else None
    call = native.BevyMoeCall(il=il, n_expert=8, n_expert_used=k, n_tokens=len(ids), ids=flat, ids_stride=k,
                              out=out, n_out_max=n_out_max, router_in=None, router_in_stride=0, n_embd=0,
                              route_only=int(route_only), batch_rows=rows, n_batch_rows=n_batch_rows,
                              batch_seq=batch_seq, **{"pass": pass_})
    call._keep = (flat, rows)  # the arrays live as long as the call
    return call, out


def call_hook(hook: object, il: int, ids: list[list[int]], route_only: bool, n_out_max: int = 4,
              pass_: int = 0, **batch: object) -> tuple[int, list]:
    """Call the hook body as the patched graph does (see moe_call)."""
    call, out = moe_call(ids, il, route_only, n_out_max, pass_, **batch)
    rc = native.bevy_hook_fn(hook.user_data, ctypes.byref(call))
    return rc, list(out)


def test_routed_gives_each_group_its_distinct_experts_sorted(cache4: ExpertCache) -> None:
    hook = cache4.native.new_hook()
    assert call_hook(hook, 1, [[5, 2], [2, 7], [3, 3], [0, 6]], route_only=True)[0] == 0
    assert hook.routed([2, 3, 4], k=2) == (1, [(2, 5, 7), (3,), (0, 6)])
    assert hook.routed([4], k=2) == (1, [(0, 2, 3, 5, 6, 7)])
    assert hook.routed([1, 1, 2], k=2) == (1, [(2, 5), (), (2, 7)])
    with pytest.raises(Exception, match="lookahead"):
        hook.routed([5], k=2)  # more rows than the call had
    assert cache4.pinned() == 0  # a route-only call pins nothing


def test_routed_rows_come_in_batch_order_however_the_ubatches_came(cache4: ExpertCache) -> None:
    # a batch of 4 rows over a KV stream per sequence, run as ubatches of rows [2, 3] then [0, 1]
    hook = cache4.native.new_hook()
    assert call_hook(hook, 1, [[3, 3], [0, 6]], True, batch_rows=[2, 3], n_batch_rows=4, batch_seq=7)[0] == 0
    with pytest.raises(Exception, match="lookahead"):
        hook.routed([4], k=2)  # rows 0 and 1 not routed yet
    assert call_hook(hook, 1, [[5, 2], [2, 7]], True, batch_rows=[0, 1], n_batch_rows=4, batch_seq=7)[0] == 0
    assert hook.routed([2, 3, 4], k=2) == (1, [(2, 5, 7), (3,), (0, 6)])
    # the next batch starts afresh; a row outside its batch fails the call
    assert call_hook(hook, 1, [[1, 4]], True, batch_rows=[0], n_batch_rows=1, batch_seq=8)[0] == 0
    assert hook.routed([1], k=2) == (1, [(1, 4)])
    rc, _ = call_hook(hook, 1, [[1, 4]], True, batch_rows=[1], n_batch_rows=1, batch_seq=9)
    assert rc == -1 and "outside the batch" in hook.last_error()


def test_router_trace_keeps_batch_order_across_ubatches() -> None:
    trace = RouterTrace(n_layer=2, k=2)
    try:
        for ids, rows, seq in (([[4, 5]], None, 0), ([[6, 7], [0, 1]], [1, 2], 1), ([[2, 3]], [0], 1),
                               ([[1, 1]], [0], 2)):
            call, _ = moe_call(ids, 0, batch_rows=rows, n_batch_rows=3, batch_seq=seq)
            assert native.bevy_router_trace_hook(trace.user_data, ctypes.byref(call)) == 0
        assert trace.read(0).tolist() == [[4, 5], [2, 3], [6, 7], [0, 1], [1, 1]]
        assert trace.rows(1) == 0
    finally:
        trace.close()


def test_a_bad_expert_id_fails_the_call_and_leaves_no_trace(cache4: ExpertCache) -> None:
    hook = cache4.native.new_hook()
    hook.begin(0)
    rc, _ = call_hook(hook, 0, [[1, 2], [3, 9]], route_only=False)  # 9 is not an expert of 8
    assert rc == -1 and "out of range" in hook.last_error()
    assert call_hook(hook, 1, [[1, 2]], route_only=False)[0] == -1  # the decode failed: its later layers too
    hook.end()
    hook.begin(1)  # the next decode
    rc, out = call_hook(hook, 0, [[1, 2]], route_only=False)  # experts the failed call had seen
    assert rc == 0 and sorted(out) == sorted(set(out)) and all(0 <= s < 4 for s in out)
    assert cache4.counters(0)["misses"] == 2
    call_hook(hook, -1, [[0, 0]], route_only=False)  # graph done: unpin
    hook.end()
    assert cache4.pinned() == 0


def test_wait_returns_on_timeout_and_counters_refuse_a_bad_layer(cache4: ExpertCache) -> None:
    version = native.bevy_cache_version(cache4.native.handle)
    assert native.bevy_cache_wait(cache4.native.handle, version, 20, 0) == version  # timed out
    assert cache4.wait(version, 20, 0) is False
    out = native.BevyCounters()
    assert native.bevy_cache_counters(cache4.native.handle, 5, ctypes.byref(out)) == -1
    assert "out of range" in native.last_error()
    assert native.bevy_cache_counters(cache4.native.handle, -1, ctypes.byref(out)) == 0


def test_a_pass_reports_the_version_before_it_and_every_layers_lookups(cache4: ExpertCache) -> None:
    flights = cache4.flights()
    flights.fill([0, 1], [(0, 1), (2,)], [0, 1], [True, True], [True, True])
    before = native.bevy_cache_version(cache4.native.handle)
    cache4.refresh(0, flights)
    assert flights.pass_.version == before
    assert flights.absent() == [2, 1]
    assert (list(flights.hits), list(flights.misses)) == ([0, 0], [2, 1])
    assert np.all(flights.rows["absent"][:2] == [2, 1])
    cache4.unreserve_all(0)


def test_a_decode_reports_the_experts_it_pinned_and_how_long_it_waited(cache4: ExpertCache) -> None:
    hook = cache4.native.new_hook()
    hook.begin(0)
    assert call_hook(hook, 0, [[1, 2], [2, 3]], route_only=False)[0] == 0  # 3 distinct, loaded now
    assert call_hook(hook, 1, [[4, 4], [4, 4]], route_only=False)[0] == 0  # 1 distinct
    call_hook(hook, -1, [[0, 0]], route_only=False)
    experts, waited = hook.end()
    assert experts == 4 and waited > 0  # it waited for the loads
    hook.begin(1)
    assert hook.end() == (0, 0.0)  # counted from begin


def test_two_passes_compute_the_loaded_experts_first_and_the_others_after_their_loads(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    slot = CacheLayout.of(info).slot_bytes
    link = LinkSpec.parse(f"throttle:{slot * 20 / 1e6:.3f}MB/s:ram")  # 50 ms per expert
    with ExpertCache(info, 4 * slot, link, n_workers=1) as cache:
        hook = cache.native.new_hook()
        hook.begin(0)
        assert call_hook(hook, 0, [[1, 2]], route_only=False)[0] == 0  # one pass: 1 and 2 loaded
        call_hook(hook, -1, [[0, 0]], route_only=False)
        rc, first = call_hook(hook, 0, [[1, 3], [2, 1]], route_only=False, pass_=1)
        assert rc == 0
        assert first[1] == -1 and first[0] >= 0 and first[2] >= 0 and first[3] == first[0]  # 3 is loading
        rc, second = call_hook(hook, 0, [[1, 3], [2, 1]], route_only=False, pass_=2)  # waits for 3
        assert rc == 0 and second[0] == second[2] == second[3] == -1 and 0 <= second[1] < 4
        assert len({first[0], first[2], second[1]}) == 3
        assert cache.counters()["loads"] == 3 and cache.counters()["stall_ns"] > 0
        rc, again = call_hook(hook, 0, [[1, 3]], route_only=False, pass_=1)  # everything is in: pass 2 is empty
        assert rc == 0 and -1 not in again
        assert call_hook(hook, 0, [[1, 3]], route_only=False, pass_=2) == (0, [-1, -1])
        assert call_hook(hook, 1, [[1, 3]], route_only=False, pass_=2)[0] != 0  # not the layer of pass 1
        assert "second pass of layer 1" in hook.last_error()
        call_hook(hook, -1, [[0, 0]], route_only=False)
        hook.end()


def test_a_pass_says_when_each_admitted_flights_loads_land(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    slot = CacheLayout.of(info).slot_bytes
    link = LinkSpec.parse(f"throttle:{slot * 40 / 1e6:.3f}MB/s:ram")  # 25 ms per expert
    with ExpertCache(info, 16 * slot, link, n_workers=1) as cache:
        warm = cache.flights()
        warm.fill([0], [(0, 1)], [0], [True], [False])
        cache.refresh(0, warm)
        assert warm.eta_s() == [0.0]  # no load has finished yet: no estimate of a load's time
        version = warm.pass_.version
        while cache.counters()["loads"] < 2:
            version = native.bevy_cache_wait(cache.native.handle, version, 1000, 0)
        flights = cache.flights()
        # lagging first: the first flight's loads go first; the third is not admitted
        flights.fill([1, 1, 0], [(2, 3), (4, 5, 6), (7,)], [1 << 32, 2 << 32, 3 << 32], [True, True, False],
                     [False] * 3)
        cache.refresh(0, flights)
        first, second, third = flights.eta_s()
        assert 0.02 < first < second and third is None
        assert second == pytest.approx(5 / 2 * first, rel=0.3)  # 5 loads behind one worker vs 2
        cache.unreserve_all(0)


@pytest.mark.parametrize("learning", [True, False])
def test_decodes_that_do_not_learn_leave_the_eviction_statistics_as_they_were(qwen3_tiny: Path,
                                                                              learning: bool) -> None:
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 4 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram"), policy="lru") as cache:
        hook = cache.native.new_hook()

        def use(experts: list[int]) -> None:
            hook.begin(0)
            assert call_hook(hook, 0, [experts], route_only=False)[0] == 0
            call_hook(hook, -1, [[0, 0]], route_only=False)  # graph done: unpin
            hook.end()

        use([0, 1])
        use([2, 3])  # the 4 slots hold 0-3, 0 and 1 least recently used
        cache.native.set_learning(learning)
        use([0, 1])  # a hit either way; it makes 0 and 1 recent only when the cache learns from it
        cache.native.set_learning(True)
        use([4, 5])  # evicts the two least recently used
        misses = cache.counters(0)["misses"]
        use([0, 1])
        # learning: 2 and 3 were evicted and 0, 1 hit; not learning: 0 and 1 were, and miss now
        assert cache.counters(0)["misses"] - misses == (0 if learning else 2)


def test_contexts_coming_and_going_keep_the_context_table_bounded(cache4: ExpertCache) -> None:
    """A server creates and frees contexts for weeks: every hook registers a context, whose entry
    each eviction scans, so a freed hook's entry goes to the next one."""
    native_cache = cache4.native
    alive = [native_cache.new_hook(), native_cache.new_hook()]
    for _ in range(1000):
        hook = native_cache.new_hook()
        hook.close()
    assert native_cache.context_entries() == 3
    for hook in alive:
        hook.close()
    again = [native_cache.new_hook() for _ in range(3)]
    assert native_cache.context_entries() == 3
    for hook in again:
        hook.close()


def test_a_context_kept_from_the_compute_gate_fails_its_decode_at_the_wait_timeout(qwen3_tiny: Path) -> None:
    """The gate has the link's bound: a context that cannot compute for --wait-timeout (another
    holds the gate that long) fails its decode with a line that says so, once, however many
    layers the graph has left; the holder, and the next decode of the failed one, go on."""
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 4 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram"), wait_timeout_s=0.2) as cache:
        cache.set_concurrency(1)
        holder, waiter = cache.native.new_hook(), cache.native.new_hook()
        for hook in (holder, waiter):
            hook.set_gated(True)
        holder.begin(0)  # holds the gate through its decode
        t0 = time.perf_counter()
        waiter.begin(5)  # gives up after 0.2 s ...
        assert 0.15 < time.perf_counter() - t0 < 2.0
        assert call_hook(waiter, 0, [[1, 2]], route_only=False)[0] == -1  # ... and fails the decode
        assert "timed out after 200 ms waiting for the compute gate" in waiter.last_error()
        t1 = time.perf_counter()
        assert call_hook(waiter, 1, [[1, 2]], route_only=False)[0] == -1  # the later layers fail at once
        assert time.perf_counter() - t1 < 0.1
        assert call_hook(waiter, -1, [[0, 0]], route_only=False)[0] == 0  # graph done
        waiter.end()
        assert call_hook(holder, 0, [[1, 2]], route_only=False)[0] == 0  # the holder computes on
        call_hook(holder, -1, [[0, 0]], route_only=False)
        holder.end()
        waiter.begin(6)  # the gate is free: the next decode runs
        assert call_hook(waiter, 0, [[1, 2]], route_only=False)[0] == 0
        call_hook(waiter, -1, [[0, 0]], route_only=False)
        waiter.end()
        for hook in (holder, waiter):
            hook.close()


def test_a_decode_on_every_thread_computes_alone_at_the_compute_gate(qwen3_tiny: Path) -> None:
    """Lanes compute side by side (the gate's capacity); a hook that asks for the whole capacity
    (a prompt call on every thread) gets it where no other context computes at its turn, and
    then keeps the others out while it computes; where one computes, it enters at once with 1
    (its call then runs on its lane's threads) instead of leaving a core idle."""
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 4 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram"), wait_timeout_s=0.2) as cache:
        cache.set_concurrency(2)
        a, b, wide = (cache.native.new_hook() for _ in range(3))
        for hook in (a, b, wide):
            hook.set_gated(True)
        wide.set_gate_weight(2)

        def enters(hook: Hook, token: int) -> bool:
            t0 = time.perf_counter()
            hook.begin(token)
            return time.perf_counter() - t0 < 0.1  # a refused turn waits the timeout (0.2 s)

        a.begin(0)
        assert enters(b, 1)  # two lanes at once
        b.end()
        assert enters(wide, 2) and wide.gate_weight() == 1  # a computes: the wide decode gets 1 ...
        assert not enters(b, 3)  # ... which fills the gate
        b.end()
        wide.end()
        a.end()
        assert enters(wide, 4) and wide.gate_weight() == 2  # the gate is empty: it gets every turn ...
        assert not enters(a, 5)  # ... and keeps the lanes out meanwhile
        a.end()
        wide.end()
        assert enters(a, 6) and enters(b, 7)  # and gives them back
        for hook in (a, b, wide):
            hook.end()
            hook.close()


def test_compute_used_weighs_each_stretch_by_the_share_of_the_gate_in_use(qwen3_tiny: Path) -> None:
    """Two lanes (capacity 2): a stretch with one computing counts half in compute_used, with both
    whole; compute_busy counts any stretch whole."""
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 4 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram")) as cache:
        cache.set_concurrency(2)
        a, b = (cache.native.new_hook() for _ in range(2))
        for hook in (a, b):
            hook.set_gated(True)
        a.begin(0)
        time.sleep(0.3)  # a alone
        b.begin(1)
        time.sleep(0.3)  # both
        a.end()
        b.end()
        c = cache.counters()
        busy, used = c["compute_busy_ns"] / 1e9, c["compute_used_ns"] / 1e9
        assert busy >= 0.6
        assert used >= 0.3 + 0.5 * 0.3 and used <= busy - 0.5 * 0.3
        for hook in (a, b):
            hook.close()
