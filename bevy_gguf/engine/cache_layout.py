"""How one model's routed experts are laid out in cache slots (pure: no native code)."""

from __future__ import annotations

from dataclasses import dataclass

from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import ModelInfo

# the order of kinds in a slot (any fixed order works; the patch matches them by name)
KIND_ORDER = ("gate", "up", "down", "gate_up", "gate.scale", "up.scale", "down.scale", "gate_up.scale")


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """How one expert is stored: its kinds, the bytes of each, and where each layer's lie."""

    kinds: tuple[str, ...]
    kind_bytes: tuple[int, ...]
    sources: dict[tuple[int, int], int]  # (layer, kind index) -> file offset of expert 0
    n_layer: int
    n_expert: int
    top_k: int

    @property
    def slot_bytes(self) -> int:
        return sum(self.kind_bytes)

    @classmethod
    def of(cls, info: ModelInfo) -> CacheLayout:
        kinds = tuple(k for k in KIND_ORDER if any(t.kind == k for t in info.expert_tensors))
        kind_bytes: dict[str, int] = {}
        sources = {}
        for t in info.expert_tensors:
            if t.n_expert != info.n_expert or t.nbytes % t.n_expert:
                raise BevyError(f"{t.name} has {t.n_expert} experts, the model {info.n_expert}: not supported")
            per_expert = t.nbytes // t.n_expert
            if kind_bytes.setdefault(t.kind, per_expert) != per_expert:
                raise BevyError(f"{t.name} differs in size from other layers' {t.kind} experts: "
                                "one expert cache cannot hold both (not supported yet)")
            sources[(t.layer, kinds.index(t.kind))] = t.offset
        return cls(kinds, tuple(kind_bytes[k] for k in kinds), sources, info.n_layer, info.n_expert,
                   info.n_expert_used)

    def min_slots(self, tokens: int = 1, contexts: int = 1) -> int:
        """Slots that `contexts` contexts pin at once, each computing a micro-batch of `tokens`
        tokens (each pins its layer's union)."""
        return contexts * min(self.n_expert, self.top_k * tokens)

    def micro_batch(self, n_slots: int, limit: int, contexts: int = 1) -> int:
        """The largest micro-batch (tokens per ubatch, at most limit) such that the worst-case
        unions of `contexts` contexts fit in n_slots together: no context can then wait for a
        slot that another holds."""
        share = n_slots // contexts
        if share >= self.n_expert:
            return limit
        return max(1, min(limit, share // self.top_k))
