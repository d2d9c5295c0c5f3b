"""Slot classes: which layers share slots, and how a byte budget is split between classes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bevy_gguf.engine.cache_layout import DENSE, PAGE, ROOM_PAGES, CacheLayout, SlotClass
from bevy_gguf.errors import BevyError


def info(down_bytes: list[int], n_expert: int = 16, top_k: int = 2, gate_bytes: int = 100,
         recurrent: bool = False) -> SimpleNamespace:
    """A model whose layer il has gate and up experts of gate_bytes and down experts of
    down_bytes[il] (0: a dense layer, without routed experts)."""
    tensors = []
    offset = 0
    for il, down in enumerate(down_bytes):
        if not down:
            continue
        for kind, per in (("gate", gate_bytes), ("up", gate_bytes), ("down", down)):
            tensors.append(SimpleNamespace(name=f"blk.{il}.ffn_{kind}_exps.weight", kind=kind, layer=il,
                                           n_expert=n_expert, nbytes=per * n_expert, offset=offset))
            offset += per * n_expert
    return SimpleNamespace(expert_tensors=tensors, n_layer=len(down_bytes), n_expert=n_expert, n_expert_used=top_k,
                           recurrent=recurrent)


def test_layers_with_the_same_bytes_per_kind_share_a_class() -> None:
    layout = CacheLayout.of(info([144, 144, 210, 210, 144]))  # Q4_K_M-like: down Q6_K in layers 2 and 3
    assert layout.classes == (SlotClass((100, 100, 144), (0, 1, 4)), SlotClass((100, 100, 210), (2, 3)))
    assert layout.layer_class == (0, 0, 1, 1, 0)
    assert layout.expert_bytes == 16 * (3 * 344 + 2 * 410)
    assert layout.layer_kind_bytes(3) == (100, 100, 210)
    assert CacheLayout.of(info([144] * 4)).slot_bytes == 344  # one class: its bytes


def test_dense_layers_have_no_class_and_no_slots() -> None:
    """GLM-4.5's and DeepSeek's leading dense layers: no experts to cache, the budget split over
    the MoE layers only."""
    layout = CacheLayout.of(info([0, 144, 144, 210]))
    assert layout.layer_class == (DENSE, 0, 0, 1) and layout.moe_layers == (1, 2, 3)
    assert layout.classes == (SlotClass((100, 100, 144), (1, 2)), SlotClass((100, 100, 210), (3,)))
    assert layout.expert_bytes == 16 * (2 * 344 + 410)
    assert layout.slot_bytes == layout.expert_bytes // (3 * 16)
    assert layout.class_slots(layout.expert_bytes // 2) == (16, 8)
    assert (0, 0) not in layout.sources and (1, 0) in layout.sources


def test_each_class_gets_the_same_share_of_its_experts() -> None:
    layout = CacheLayout.of(info([144, 144, 210, 210]))
    slots = layout.class_slots(layout.expert_bytes // 4)
    assert slots == (8, 8)  # 25% of 32 experts each
    assert layout.class_slots(layout.expert_bytes) == (32, 32)
    assert layout.class_slots(10 * layout.expert_bytes) == (32, 32)  # never more than the experts


@pytest.mark.parametrize("share", [0.07, 0.25, 0.33, 0.5, 0.9, 0.999])
def test_the_budget_is_never_exceeded_and_what_is_left_is_under_a_slot_per_class(share: float) -> None:
    layout = CacheLayout.of(info([144, 144, 210, 210, 144, 300, 144, 144], n_expert=64, top_k=4))
    budget = int(share * layout.expert_bytes)
    slots = layout.class_slots(budget)
    used = sum(n * c.bytes for n, c in zip(slots, layout.classes))
    assert used <= budget
    assert all(n == len(c.layers) * 64 or budget - used < c.bytes for n, c in zip(slots, layout.classes))
    assert all(n >= layout.min_slots(1) for n in slots)


def test_the_minimum_is_one_tokens_experts_in_every_class() -> None:
    layout = CacheLayout.of(info([144, 210], top_k=2))
    assert layout.min_bytes() == 2 * 344 + 2 * 410
    assert layout.class_slots(layout.min_bytes()) == (2, 2)
    # a class whose share would round below its minimum gets it, taken from the fuller one
    big = CacheLayout.of(info([144] * 7 + [210], n_expert=16, top_k=4))
    slots = big.class_slots(int(0.1 * big.expert_bytes))
    assert slots[1] == 4 and sum(n * c.bytes for n, c in zip(slots, big.classes)) <= int(0.1 * big.expert_bytes)


def test_recurrent_layers_need_no_more_slots() -> None:
    """Patch 0011 fixed llama.cpp's equal split (a batch split by sequence, as a model with
    recurrent layers or a KV stream per sequence has it) taking n_ubatch + 1 sequences: a graph
    holds at most its micro-batch, recurrent layers or not (the e2e runs at the minimum cache
    decode every arch through that split)."""
    plain, recurrent = CacheLayout.of(info([144, 144])), CacheLayout.of(info([144, 144], recurrent=True))
    assert (plain.min_slots(1), recurrent.min_slots(1)) == (2, 2)
    assert (plain.micro_batch(8, 64), recurrent.micro_batch(8, 64)) == (4, 4)
    assert recurrent.micro_batch(recurrent.min_slots(1), 64) == 1
    assert recurrent.micro_batch(16, 64) == 64  # every expert fits: no bound
    assert recurrent.min_slots(1, 8) == plain.min_slots(1, 8) == 16


def test_a_layer_missing_a_kind_is_refused() -> None:
    bad = info([144, 144])
    bad.expert_tensors = [t for t in bad.expert_tensors if not (t.layer == 1 and t.kind == "up")]
    with pytest.raises(BevyError, match="layer 1 lacks the up expert tensors"):
        CacheLayout.of(bad)


def test_a_lane_keeps_its_reservations_only_while_they_leave_its_calls_whole() -> None:
    """64 experts, top-8, calls of up to 8 tokens: a call needs at most 64 slots of a class."""
    layout = CacheLayout.of(info([144] * 8, n_expert=64, top_k=8))
    assert layout.lane_share(128, 1, 8) == (True, 64)    # half of 128 still holds any call: reserve
    assert layout.lane_share(64, 1, 8) == (False, 64)    # half would cut calls to 4 tokens: do not
    assert layout.micro_batch(64, 8) == 8 and layout.micro_batch(32, 8) == 4
    assert layout.lane_share(256, 2, 8) == (True, 64)    # two lanes: each half of its own share
    assert layout.lane_share(128, 2, 8) == (False, 64)   # ... or its whole share, the lanes' never overlap
    assert layout.lane_share(8, 1, 8) == (False, 8)      # the minimum: one token's experts per call


def test_the_prompt_permit_takes_what_the_other_lanes_decode_steps_leave() -> None:
    """64 experts, top-8, 96 slots (the 6-layer mixtral shape at 25%), two lanes of 4 sequences:
    equal shares of 48 cut prompt chunks to 6 tokens; a decode step of 4 sequences pins at most
    32, so the lane holding the permit may pin 64 (a whole layer: chunks of any size)."""
    layout = CacheLayout.of(info([144] * 6, n_expert=64, top_k=8))
    assert layout.prefill_shares(96, 2, 4, 512) == (32, 64)
    assert layout.micro_batch(48, 512) == 6 and layout.micro_batch(64, 512) == 512
    small, big = layout.prefill_shares(96, 3, 3, 512)  # three lanes: the two without it pin 24 each
    assert (small, big) == (24, 48) and 2 * small + big <= 96
    assert layout.prefill_shares(128, 2, 4, 512) is None  # an equal share holds a layer already
    assert layout.prefill_shares(96, 1, 8, 512) is None   # one lane: its share is the cache
    assert layout.prefill_shares(96, 2, 8, 512) is None   # a decode step of 6+ sequences fills its half
    for slots in range(16, 200):
        for lanes in (2, 3, 4):
            for seqs in (1, 2, 4, 8):
                got = layout.prefill_shares(slots, lanes, seqs, 512)
                if got is not None:  # never more pins than slots, and a decode step still fits
                    assert (lanes - 1) * got[0] + got[1] <= slots and got[0] >= layout.min_slots(1)
                    assert layout.micro_batch(got[1], 512) > layout.micro_batch(slots // lanes, 512)


def pages_info(pages: int, start: int, n_expert: int = 4) -> SimpleNamespace:
    """Two layers of gate/up/down experts of `pages` pages each, the file's tensors from `start` on."""
    tensors, offset = [], start
    for il in range(2):
        for kind in ("gate", "up", "down"):
            tensors.append(SimpleNamespace(name=f"blk.{il}.ffn_{kind}_exps.weight", kind=kind, layer=il,
                                           n_expert=n_expert, nbytes=pages * PAGE * n_expert, offset=offset))
            offset += pages * PAGE * n_expert
    return SimpleNamespace(expert_tensors=tensors, n_layer=2, n_expert=n_expert, n_expert_used=2, recurrent=False)


def test_slots_take_a_page_of_room_where_whole_page_experts_do_not_start_pages() -> None:
    """Real files align tensors to 32 bytes: an expert of whole pages there gets a slot a page
    larger (an O_DIRECT read of its page-aligned superset lands in it); page-aligned files, small
    experts (the room would cost more than 1/ROOM_PAGES), offsets a tensor may not start at, and
    experts an upload worker lays out (straight False) keep packed slots."""
    big = ROOM_PAGES * PAGE
    (c,) = CacheLayout.of(pages_info(ROOM_PAGES, 4096 + 96)).classes
    assert c.kind_stride == (big + PAGE,) * 3 and c.bytes == 3 * big and c.alloc_bytes == 3 * (big + PAGE)
    for layout in (CacheLayout.of(pages_info(ROOM_PAGES, 8192)), CacheLayout.of(pages_info(ROOM_PAGES - 1, 96)),
                   CacheLayout.of(pages_info(ROOM_PAGES, 4096 + 8)),
                   CacheLayout.of(pages_info(ROOM_PAGES, 96), straight=lambda il, k: False)):
        assert layout.classes[0].kind_stride == () and layout.classes[0].alloc_bytes == layout.classes[0].bytes
    mixed = CacheLayout.of(pages_info(ROOM_PAGES, 96), straight=lambda il, k: k != 2)  # down repacked
    assert mixed.classes[0].kind_stride == (big + PAGE, big + PAGE, big)


def test_room_is_paid_from_the_budget_and_percentages_hold_every_expert() -> None:
    layout = CacheLayout.of(pages_info(ROOM_PAGES, 96))
    c = layout.classes[0]
    assert layout.slot_memory == 8 * c.alloc_bytes > layout.expert_bytes
    assert layout.class_slots(layout.slot_memory) == (8,)  # 100% of the slot memory: every expert
    assert layout.class_slots(layout.expert_bytes) == (7,)  # the experts' bytes alone hold one fewer
    assert layout.min_bytes() == layout.min_slots(1) * c.alloc_bytes
