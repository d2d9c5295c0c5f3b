"""bevy_cache_refresh: the self-balancing scheduler's one call per pass (reserve, load, ask)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bevy_gguf._native import libbevy as native
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model

Flight = tuple[int, list[int], bool, bool]  # layer, experts, admitted, counted


def refresh(cache: ExpertCache, flights: list[Flight], owner: int = 0) -> list[int] | None:
    """Absent experts per flight, or None when libbevy refused the call."""
    buf = cache.flights()
    buf.fill([f[0] for f in flights], [tuple(f[1]) for f in flights], list(range(len(flights))),
             [f[2] for f in flights], [f[3] for f in flights])
    rc = native.bevy_cache_refresh(cache.native.handle, owner, buf.pointer(), buf.n, None)
    return None if rc != 0 else buf.absent()


def settle(cache: ExpertCache, flights: list[Flight], want: list[int], timeout_s: float = 10.0) -> list[int]:
    """Refresh (counting nothing) until the absent counts are want, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = refresh(cache, [(il, e, a, False) for il, e, a, _ in flights])
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


@pytest.fixture()
def cache3(qwen3_tiny: Path) -> ExpertCache:
    """A cache of 3 slots over the tiny model (2 layers of 8 experts, top-2)."""
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 3 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram")) as cache:
        yield cache


def test_admitted_flights_load_others_only_ask(cache3: ExpertCache) -> None:
    flights = [(0, [0, 1], True, True), (1, [2], False, True)]
    assert refresh(cache3, flights) == [2, 1]
    assert settle(cache3, flights, [0, 1]) == [0, 1]  # the admitted one loaded, the other never
    c0, c1 = cache3.counters(0), cache3.counters(1)
    assert (c0["misses"], c0["loads"], c1["misses"], c1["loads"]) == (2, 2, 1, 0)
    refresh(cache3, [(0, [0, 1], True, False)])  # counted once: asking again counts nothing
    assert (cache3.counters(0)["hits"], cache3.counters(0)["misses"]) == (0, 2)


def test_reserved_experts_are_never_evicted_by_later_loads(cache3: ExpertCache) -> None:
    front = (0, [0, 1], True, False)
    assert settle(cache3, [front], [0]) == [0]
    # one slot is left: the flight behind gets one of its two experts, never the front's slots
    behind = (1, [2, 3], True, False)
    assert settle(cache3, [front, behind], [0, 1]) == [0, 1]
    time.sleep(0.05)
    assert refresh(cache3, [front, behind]) == [0, 1]
    # without the front's reservation its experts may go
    assert settle(cache3, [behind], [0]) == [0]


def test_a_bad_expert_id_changes_nothing(cache3: ExpertCache) -> None:
    before = cache3.counters()
    assert refresh(cache3, [(0, [0], True, True), (1, [99], True, True)]) is None
    assert "out of range" in native.last_error()
    assert refresh(cache3, [(5, [0], True, True)]) is None
    assert cache3.counters() == before


def test_a_queued_load_evicts_nothing_until_the_link_takes_it(qwen3_tiny: Path) -> None:
    """A scheduler's loads wait in the link's queue without a slot: each evicts when a worker
    starts it (not when asked for), and the slot it gets is held for the flight that asked."""
    info = inspect_model(qwen3_tiny)
    slot = CacheLayout.of(info).slot_bytes
    link = LinkSpec.parse(f"throttle:{4 * slot}B/s:ram")  # emulated: 0.25 s per expert
    with ExpertCache(info, 4 * slot, link, n_workers=1) as cache:
        assert settle(cache, [(0, [0, 1, 2, 3], True, False)], [0]) == [0]  # the 4 slots hold layer 0
        assert refresh(cache, [(1, [0, 1, 2, 3], True, False)]) == [4]  # layer 0 no longer reserved
        evicted_at_once = cache.counters(1)["evictions"]
        assert evicted_at_once <= 1  # only the job the one worker took; asked-for slots used to go at once
        assert settle(cache, [(1, [0, 1, 2, 3], True, False)], [0]) == [0]
        c1 = cache.counters(1)
        assert (c1["loads"], c1["evictions"]) == (4, 4)
        assert cache.pinned() == 4  # reserved for the flight
        cache.unreserve_all(0)
        assert cache.pinned() == 0


def test_a_queued_load_no_flight_wants_any_more_is_not_held(qwen3_tiny: Path) -> None:
    """A slot chosen for a queued load joins its owner's reservations only if the owner's last
    refresh still wants that expert: an owner holds no more than its admitted flights need
    (the lanes' no-deadlock rule counts on it)."""
    info = inspect_model(qwen3_tiny)
    slot = CacheLayout.of(info).slot_bytes
    link = LinkSpec.parse(f"throttle:{4 * slot}B/s:ram")  # emulated: 0.25 s per expert
    with ExpertCache(info, 6 * slot, link, n_workers=1) as cache:
        assert refresh(cache, [(1, [0, 1, 2, 3], True, False)]) == [4]  # 4 loads queued
        assert refresh(cache, [(1, [0, 1, 2, 3], False, False)]) == [4]  # no longer admitted
        deadline = time.monotonic() + 10
        while cache.counters(1)["loads"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the last one lands
        assert cache.counters(1)["loads"] == 4
        assert cache.pinned() == 0  # the old rule held those taken after the refresh
        assert refresh(cache, [(1, [0, 1, 2, 3], True, False)]) == [0]  # loaded all the same


def test_slot_classes_evict_only_within_a_class() -> None:
    """Q4_K_M's two layouts (ffn_down Q4_K in layers 0-1, Q6_K in 2-3) at the minimum: two slots
    per class. Loads of layer 1 evict layer 0's experts, never layer 2's; bytes count each
    class's own size."""
    from conftest import quant_spec

    from bevy_gguf.synth import ensure_model

    info = inspect_model(ensure_model(quant_spec("Q4_K_M", experts=16), progress=False))
    layout = CacheLayout.of(info)
    assert layout.layer_class == (0, 0, 1, 1)
    with ExpertCache(info, layout.min_bytes(), LinkSpec.parse("ram")) as cache:
        assert cache.class_slots == (2, 2) and cache.budget_bytes == layout.min_bytes()  # nothing left over
        assert settle(cache, [(0, [0, 1], True, False)], [0]) == [0]
        assert settle(cache, [(2, [0, 1], True, False)], [0]) == [0]  # the other class: nothing evicted
        assert cache.counters()["evictions"] == 0
        assert settle(cache, [(1, [3, 4], True, False)], [0]) == [0]  # class 0 is full: layer 0's go
        assert cache.counters()["evictions"] == 2
        assert refresh(cache, [(2, [0, 1], False, False), (0, [0, 1], False, False)]) == [0, 2]
        c0, c2 = cache.counters(0), cache.counters(2)
        assert c0["bytes_loaded"] == 2 * layout.classes[0].bytes and c2["bytes_loaded"] == 2 * layout.classes[1].bytes
        assert layout.classes[0].bytes != layout.classes[1].bytes


@pytest.mark.parametrize("unrevealed", [0, 1, 2])
def test_eviction_takes_an_expert_no_flight_asked_for(cache3: ExpertCache, unrevealed: int) -> None:
    """Next-use eviction keeps what any owner's flights revealed they need, admitted or not
    (another lane's flight behind its load budget): the one expert nobody asked for goes."""
    assert settle(cache3, [(0, [0, 1, 2], True, False)], [0]) == [0]  # the 3 slots hold layer 0's 0-2
    revealed = [e for e in (0, 1, 2) if e != unrevealed]
    assert refresh(cache3, [(0, revealed, False, False)], owner=1) == [0]  # asks, holds nothing
    assert settle(cache3, [(1, [5], True, False)], [0]) == [0]  # owner 0 loads one more: one goes
    assert refresh(cache3, [(0, revealed, False, False)], owner=1) == [0]  # what owner 1 asked for stayed
    assert refresh(cache3, [(0, [unrevealed], False, False)], owner=1) == [1]
    cache3.unreserve_all(1)
