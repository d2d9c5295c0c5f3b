"""The expert cache of one model: libbevy's slot pool, its link, and the hooks of its contexts."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from bevy_gguf import native
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import ModelInfo, router_weights
from bevy_gguf.llm import Context
from bevy_gguf.offload import LinkSpec

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


class ExpertCache:
    """A native expert cache over a link; hands a hook to every context that uses it."""

    def __init__(self, info: ModelInfo, budget_bytes: int, link: LinkSpec, policy: str = "next-use",
                 n_workers: int = 4, wait_timeout_s: float = 300.0, seed: int = 0) -> None:
        self.lib = native.libbevy()
        self.layout = layout = CacheLayout.of(info)
        if len(layout.kinds) > native.MAX_KINDS:
            raise BevyError(f"{len(layout.kinds)} expert tensor kinds: at most {native.MAX_KINDS} are supported")
        n_total = layout.n_layer * layout.n_expert
        self.n_slots = min(budget_bytes // layout.slot_bytes, n_total)
        minimum = layout.min_slots(1) * layout.slot_bytes
        if self.n_slots < layout.min_slots(1):
            raise BevyError(f"--expert-cache of {budget_bytes} bytes is below the minimum of {minimum} bytes "
                            f"({layout.top_k} experts of {layout.slot_bytes} bytes): raise it")
        self.budget_bytes = self.n_slots * layout.slot_bytes
        self.link_ptr = self._open_link(info, link)
        self.link_name = self._describe_link()
        params = self.lib.bevy_cache_default_params()
        params.n_layer, params.n_expert, params.n_kinds = layout.n_layer, layout.n_expert, len(layout.kinds)
        for i, b in enumerate(layout.kind_bytes):
            params.kind_bytes[i] = b
        params.n_slots = self.n_slots
        if policy not in native.POLICIES:
            raise BevyError(f"unknown eviction policy {policy!r}: choose one of {', '.join(native.POLICIES)}")
        params.policy = native.POLICIES[policy]
        params.n_workers = n_workers
        params.wait_timeout_ms = int(wait_timeout_s * 1000)
        params.seed = seed
        self.ptr = self.lib.bevy_cache_new(ctypes.byref(params), self.link_ptr)
        if not self.ptr:
            self.lib.bevy_link_free(self.link_ptr)
            raise BevyError(f"cannot create the expert cache: {native.last_error()}")
        for (il, kind), offset in layout.sources.items():
            self.lib.bevy_cache_set_source(self.ptr, il, kind, offset)
        self.hooks: list[int] = []

    def _open_link(self, info: ModelInfo, spec: LinkSpec) -> int:
        path = str(info.path).encode()
        if spec.base == "file":
            ptr = self.lib.bevy_link_file_new(path)
        else:
            ranges = [(t.offset, t.nbytes) for t in info.expert_tensors]
            offsets = (ctypes.c_uint64 * len(ranges))(*(r[0] for r in ranges))
            sizes = (ctypes.c_uint64 * len(ranges))(*(r[1] for r in ranges))
            ptr = self.lib.bevy_link_ram_new(path, offsets, sizes, len(ranges))
        if ptr and spec.rate is not None:
            ptr = self.lib.bevy_link_throttle_new(ptr, spec.rate)
        if not ptr:
            raise BevyError(f"cannot open the {spec.base} link: {native.last_error()}")
        return ptr

    def _describe_link(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.bevy_link_describe(self.link_ptr, buf, len(buf))
        return buf.value.decode()

    def require_slots(self, contexts: int) -> None:
        """Refuse a cache too small for `contexts` contexts decoding one token each."""
        need = self.layout.min_slots(1, contexts)
        if self.n_slots < need:
            raise BevyError(f"an expert cache of {self.budget_bytes} bytes holds {self.n_slots} experts; "
                            f"{contexts} contexts need at least {need} ({need * self.layout.slot_bytes} bytes): "
                            "raise --expert-cache or lower --parallel")

    def enable_prefetch(self, model_path: str) -> None:
        """Give the cache every layer's router, for next-layer prediction."""
        for il, w in router_weights(model_path).items():
            if w.shape[0] != self.layout.n_expert:
                raise BevyError(f"layer {il}'s router has {w.shape[0]} rows, the model {self.layout.n_expert} experts")
            self.lib.bevy_cache_set_router(self.ptr, il, w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), w.shape[1])

    def attach(self, ctx: Context, prefetch: bool = False) -> int:
        """Serve ctx's expert matmuls from this cache (a hook of its own, the shared slots) and
        put it behind the cache's compute gate; returns the hook (also ctx.hook). prefetch:
        predict and load the next layer's experts."""
        hook = self.lib.bevy_hook_new(self.ptr)
        if not hook:
            raise BevyError(f"cannot create a cache hook: {native.last_error()}")
        self.hooks.append(hook)
        ctx.hook = hook
        self.lib.bevy_hook_set_prefetch(hook, int(prefetch))
        self.lib.bevy_hook_set_gated(hook, 1)
        native.llama_set_moe_hook(ctx.lib, ctx.ptr, native.hook_address(self.lib.bevy_hook_fn), hook,
                                  want_router_in=prefetch)
        tensors = (native.LlamaMoeCacheTensor * len(self.layout.kinds))()
        for i, (kind, nbytes) in enumerate(zip(self.layout.kinds, self.layout.kind_bytes)):
            tensors[i].kind = kind.encode()
            tensors[i].data = self.lib.bevy_cache_slot_data(self.ptr, i)
            tensors[i].nbytes = nbytes * self.n_slots
        if native.llama_set_moe_cache(ctx.lib, ctx.ptr, tensors, self.n_slots) != 0:
            raise BevyError("llama.cpp refused the expert cache for this model (its log says why)")
        ctx.explain_failure = lambda: (self.lib.bevy_hook_last_error(hook) or b"").decode(errors="replace")
        return hook

    def set_concurrency(self, n: int) -> None:
        """How many contexts compute at once (the compute gate's capacity)."""
        self.lib.bevy_cache_set_concurrency(self.ptr, n)

    def begin(self, ctx: Context, token: int) -> None:
        """Before a decode of ctx: its progress, and a turn at the compute gate."""
        self.lib.bevy_hook_begin(ctx.hook, token)

    def end(self, ctx: Context) -> None:
        self.lib.bevy_hook_end(ctx.hook)

    def trace(self, max_events: int) -> None:
        """Record wait/compute/load events (0: stop)."""
        self.lib.bevy_cache_trace(self.ptr, max_events)

    def events(self) -> list[tuple[int, int, int, int, int, int]]:
        """(kind, context, layer, expert, t0_ns, t1_ns) recorded since the last call."""
        out: list[tuple[int, int, int, int, int, int]] = []
        buf = (native.BevyEvent * 4096)()
        while (n := self.lib.bevy_cache_events(self.ptr, buf, len(buf))) > 0:
            out += [(e.kind, e.context, e.layer, e.expert, e.t0_ns, e.t1_ns) for e in buf[:n]]
        return out

    def counters(self, il: int = -1) -> dict[str, int]:
        """hits, misses, loads, bytes_loaded, evictions, stall_ns, link_busy_ns and the prefetch
        counts (of layer il, or of all), and link_bounced: the link's reads that needed a bounce
        copy (unaligned O_DIRECT; whole link)."""
        c = native.BevyCounters()
        self.lib.bevy_cache_counters(self.ptr, il, ctypes.byref(c))
        return {f: getattr(c, f) for f, _ in native.BevyCounters._fields_} | {
            "link_bounced": self.lib.bevy_link_bounced(self.link_ptr)}

    def release_hooks(self) -> None:
        """Free the hooks (their contexts must be gone)."""
        for hook in self.hooks:
            self.lib.bevy_hook_free(hook)
        self.hooks.clear()

    def close(self) -> None:
        """Free the hooks (their contexts must be gone), the cache, then the link."""
        self.release_hooks()
        if self.ptr:
            self.lib.bevy_cache_free(self.ptr)
            self.lib.bevy_link_free(self.link_ptr)
            self.ptr = None

    def __enter__(self) -> ExpertCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hit_rate(counters: dict[str, float]) -> float:
    looked_up = counters.get("hits", 0) + counters.get("misses", 0)
    return counters.get("hits", 0) / looked_up if looked_up else 0.0
