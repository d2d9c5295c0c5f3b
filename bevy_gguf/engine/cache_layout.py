"""How one model's routed experts are laid out in cache slots (pure: no native code).

A slot holds one expert of one layer: every kind of it (gate, up, down, ...). Layers whose
experts have the same bytes per kind share a slot class; a model from llama-quantize's mixes
has several (Q4_K_M: ffn_down Q6_K in some layers, Q4_K in the others). Each class gets its own
slots, and the byte budget is split so that every class holds the same share of its experts
(layers are visited alike, so no class is starved), each at least one token's experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import ModelInfo

# the order of kinds in a slot (any fixed order works; the patch matches them by name)
KIND_ORDER = ("gate", "up", "down", "gate_up", "gate.scale", "up.scale", "down.scale", "gate_up.scale")
MAX_CLASSES = 16  # libbevy's BEVY_MAX_CLASSES
# libbevy's BEVY_DENSE_LAYER: the class of a layer without routed experts (GLM's leading dense layers)
DENSE = -1
PAGE = 4096  # O_DIRECT's alignment of file offsets, sizes and buffers
TENSOR_ALIGN = 32  # ggml's TENSOR_ALIGNMENT: where a tensor over the slots may start
ROOM_PAGES = 32  # a slot takes a page of room for unaligned reads only where its expert has this many pages
                 # (the room then costs at most 1/32 of the slot's memory)


@dataclass(frozen=True, slots=True)
class SlotClass:
    """The slots of the layers whose experts have these bytes per kind."""

    kind_bytes: tuple[int, ...]  # one expert, per kind (in CacheLayout.kinds order)
    layers: tuple[int, ...]      # ascending
    # bytes from one slot to the next, per kind (empty: kind_bytes, packed); a page more than an
    # expert of whole pages whose file offsets do not start pages: the slot then takes an O_DIRECT
    # read of the expert's page-aligned superset, the expert at its offset's place in the page
    # (libbevy's bevy_cache_slot_phase), instead of a bounce buffer and a copy
    kind_stride: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        """One expert, every kind."""
        return sum(self.kind_bytes)

    @property
    def strides(self) -> tuple[int, ...]:
        return self.kind_stride or self.kind_bytes

    @property
    def alloc_bytes(self) -> int:
        """Memory one slot takes (its padding included)."""
        return sum(self.strides)


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """How one expert is stored: its kinds, the bytes of each per slot class, and where each layer's lie."""

    kinds: tuple[str, ...]
    classes: tuple[SlotClass, ...]
    layer_class: tuple[int, ...]          # per layer: its class (DENSE: no routed experts)
    sources: dict[tuple[int, int], int]  # (layer, kind index) -> file offset of expert 0
    n_layer: int
    n_expert: int
    top_k: int

    @property
    def slot_bytes(self) -> int:
        """Bytes of one expert: of the only class, or on average over the model's experts."""
        if len(self.classes) == 1:
            return self.classes[0].bytes
        return self.expert_bytes // (len(self.moe_layers) * self.n_expert)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The layers with routed experts (every layer but dense leading ones)."""
        return tuple(il for il, c in enumerate(self.layer_class) if c != DENSE)

    @property
    def expert_bytes(self) -> int:
        """Bytes of every routed expert of the model."""
        return sum(c.bytes * len(c.layers) * self.n_expert for c in self.classes)

    @property
    def slot_memory(self) -> int:
        """The cache's memory for every routed expert (their slots' room included): what a
        percentage of the experts (--expert-cache 25%) is a share of."""
        return sum(c.alloc_bytes * len(c.layers) * self.n_expert for c in self.classes)

    def layer_kind_bytes(self, il: int) -> tuple[int, ...]:
        return self.classes[self.layer_class[il]].kind_bytes

    @staticmethod
    def kinds_of(info: ModelInfo) -> tuple[str, ...]:
        """The expert tensor kinds of info, in slot order."""
        return tuple(k for k in KIND_ORDER if any(t.kind == k for t in info.expert_tensors))

    @classmethod
    def of(cls, info: ModelInfo, straight: Callable[[int, int], bool] | None = None) -> CacheLayout:
        """The layout of info's experts; straight(layer, kind index) says whether that tensor's
        experts are read from the file into their slots as they are (None: every one is; not where
        an upload worker lays them out, as ggml-cpu's repacked layouts or a device's memory), which
        decides where slots take room for reads that do not start a page (SlotClass.kind_stride)."""
        kinds = cls.kinds_of(info)
        per_layer: dict[int, dict[str, int]] = {}
        sources = {}
        for t in info.expert_tensors:
            if t.n_expert != info.n_expert or t.nbytes % t.n_expert:
                raise BevyError(f"{t.name} has {t.n_expert} experts, the model {info.n_expert}: not supported")
            per_layer.setdefault(t.layer, {})[t.kind] = t.nbytes // t.n_expert
            sources[(t.layer, kinds.index(t.kind))] = t.offset
        signatures: list[tuple[int, ...]] = []
        layer_class = []
        for il in range(info.n_layer):
            got = per_layer.get(il, {})
            if not got:  # a dense FFN layer: the hook never sees it
                layer_class.append(DENSE)
                continue
            if set(got) != set(kinds):
                missing = ", ".join(sorted(set(kinds) - set(got)))
                raise BevyError(f"layer {il} lacks the {missing} expert tensors the other layers have: not supported")
            sig = tuple(got[k] for k in kinds)
            if sig not in signatures:
                signatures.append(sig)
            layer_class.append(signatures.index(sig))
        if len(signatures) > MAX_CLASSES:
            raise BevyError(f"the experts come in {len(signatures)} layouts across layers: "
                            f"one expert cache serves at most {MAX_CLASSES}")
        classes = []
        for i, sig in enumerate(signatures):
            layers = tuple(il for il, c in enumerate(layer_class) if c == i)
            strides = tuple(_stride(nbytes, [(il, k) for il in layers], sources, straight)
                            for k, nbytes in enumerate(sig))
            classes.append(SlotClass(sig, layers, strides if strides != sig else ()))
        return cls(kinds, tuple(classes), tuple(layer_class), sources, info.n_layer, info.n_expert, info.n_expert_used)

    def min_slots(self, tokens: int = 1, contexts: int = 1) -> int:
        """Slots of each class that `contexts` contexts pin at once, each computing a micro-batch
        of `tokens` tokens (each pins its layer's union)."""
        return contexts * min(self.n_expert, self.top_k * tokens)

    def min_bytes(self) -> int:
        """The smallest budget: every class holds one token's experts."""
        return sum(self.min_slots(1) * c.alloc_bytes for c in self.classes)

    def class_slots(self, budget_bytes: int) -> tuple[int, ...]:
        """Slots per class for a byte budget: the same share of each class's experts, at least
        min_slots(1) each, the rest of the budget filled (bytes allocated, padding included, <=
        budget_bytes, less than one slot of each class left over). Below min_bytes(), the classes' minimums (the
        caller refuses such a budget)."""
        caps = [len(c.layers) * self.n_expert for c in self.classes]
        share = min(1.0, budget_bytes / self.expert_bytes)
        floor = [min(cap, self.min_slots(1)) for cap in caps]
        slots = [max(f, min(cap, math.floor(share * cap))) for f, cap in zip(floor, caps)]

        def used() -> int:
            return sum(n * c.alloc_bytes for n, c in zip(slots, self.classes))

        while used() > budget_bytes:  # the minimums raised some: take from the fullest others
            over = [i for i, n in enumerate(slots) if n > floor[i]]
            if not over:
                break
            slots[max(over, key=lambda i: slots[i] / caps[i])] -= 1
        while True:  # what is left: one more slot to the emptiest class it fits
            room = budget_bytes - used()
            fits = [i for i, c in enumerate(self.classes) if slots[i] < caps[i] and c.alloc_bytes <= room]
            if not fits:
                return tuple(slots)
            slots[min(fits, key=lambda i: slots[i] / caps[i])] += 1

    def lane_share(self, n_slots: int, lanes: int, limit: int) -> tuple[bool, int]:
        """(keeps its reservations, slots a call may pin) for one of `lanes` lanes over n_slots
        (of the smallest class). A lane that keeps its reservations while it computes pins at most
        half its share in a call, the other half being what it reserves; it keeps them only while
        that half still holds a call as large as its whole share would (measured, Q4_K_M at 25%:
        halved calls, 22 per step instead of 8, cost 1.5x blocking's compute and 0.66x its
        speed; whole calls without reservations 0.92x, the same bytes). Otherwise it drops them
        before each call, and its calls may pin its whole share."""
        own = n_slots // max(lanes, 1)
        half = own // 2
        if half >= self.min_slots(1) and self.micro_batch(half, limit) >= self.micro_batch(own, limit):
            return True, half
        return False, own

    def prefill_shares(self, n_slots: int, lanes: int, lane_seqs: int, limit: int) -> tuple[int, int] | None:
        """(slots a lane's call may pin, slots the one lane holding the prompt permit may pin) for
        lanes that drop their reservations before each call, or None where the permit would not
        give a larger prompt chunk. Every lane but the holder pins at most one decode step of its
        sequences (lane_seqs at most), so the holder gets the rest: its prompt chunks need a
        layer's experts, which an equal share may not hold (measured: the 6-layer mixtral shape
        at 25%, 96 slots, 2 lanes: shares of 48 made prompt chunks of 6 tokens whose waves spread
        over layers and reloaded experts loaded milliseconds before, 1.84x one lane's bytes). The
        pins never exceed n_slots: small * (lanes - 1) + big."""
        own = n_slots // max(lanes, 1)
        small = min(own, self.min_slots(lane_seqs))
        big = n_slots - (lanes - 1) * small
        if lanes < 2 or self.micro_batch(big, limit) <= self.micro_batch(own, limit):
            return None
        return small, big

    def micro_batch(self, n_slots: int, limit: int, contexts: int = 1) -> int:
        """The largest micro-batch (tokens per ubatch, at most limit) such that the worst-case
        unions of `contexts` contexts fit in n_slots (of the smallest class) together: no
        context can then wait for a slot that another holds (a ubatch holds at most n_ubatch
        tokens: patch 0011 fixed the equal split's one sequence too many)."""
        share = n_slots // contexts
        if share >= self.n_expert:
            return limit
        return max(1, min(limit, share // self.top_k))


def _stride(nbytes: int, keys: list[tuple[int, int]], sources: dict[tuple[int, int], int],
            straight: Callable[[int, int], bool] | None) -> int:
    """Bytes from one slot of a kind to the next (see SlotClass.kind_stride): a page more than the
    expert where its bytes are whole pages (at least ROOM_PAGES), some of its layers' experts do
    not start pages, all of them start where a tensor may (TENSOR_ALIGN), and every one is read
    straight into its slot."""
    offsets = [sources[key] for key in keys]
    if nbytes % PAGE or nbytes < ROOM_PAGES * PAGE or all(o % PAGE == 0 for o in offsets) \
            or any(o % TENSOR_ALIGN for o in offsets):
        return nbytes
    if straight is not None and not all(straight(il, k) for il, k in keys):
        return nbytes
    return nbytes + PAGE
