"""The expert cache of one model: libbevy's slot pool over a link, and the hooks of its contexts.

Runners use it through methods (attach a context, begin/end a decode, a scheduling pass, a wait);
the handles behind it are bevy_handles'.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import gguf

from bevy_gguf._native import libbevy, llama_ext
from bevy_gguf._native.bevy_handles import Flights, Hook, Link, NativeCache
from bevy_gguf._native.llama_handles import Context
from bevy_gguf.config import LinkSpec, parse_cache_size
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.device_slots import DeviceSlots
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import ModelInfo, router_weights


def open_link(info: ModelInfo, spec: LinkSpec) -> Link:
    """The link of spec over the model's file: its experts read from the file or from a RAM copy."""
    if spec.base == "file":
        link = Link.file(info.path)
    else:
        link = Link.ram(info.path, [(t.offset, t.nbytes) for t in info.expert_tensors])
    if spec.faults:
        return link.fault(**spec.fault_plan())
    return link.throttle(spec.rate) if spec.rate is not None else link


FILL_QUIET_S = 5.0  # a start-up fill gives up once no load has ended for this long (failed or stalled loads)


class ExpertCache:
    """A native expert cache over a link; hands a hook to every context that uses it."""

    def __init__(self, info: ModelInfo, budget: int | str, link: LinkSpec, policy: str = "next-use",
                 n_workers: int = 4, wait_timeout_s: float = 300.0, seed: int = 0,
                 repack: ModuleType | None = None, device: str | None = None,
                 lib: ModuleType | None = None) -> None:
        """budget: bytes, or an --expert-cache text (`25%` of the slot memory that holds every
        expert, CacheLayout.slot_memory; `512MiB`). repack: the patched llama_cpp whose CPU kernels
        read the slots; experts of types it repacks (Q4_0, Q4_K, IQ4_NL, MXFP4 with AVX2) are laid
        out as stock lays out repacked weights, so the cache runs stock's kernels (llama.cpp's
        default; None: the file's bytes, as --no-repack).
        device: the slots live in that ggml device's memory (device_slots.py; lib: the patched
        llama_cpp that allocates them), in the file's layout; None: host memory."""
        layout, repacked = self.plan_layout(info, repack, device)
        self.layout = layout
        budget_bytes = parse_cache_size(budget, layout.slot_memory) if isinstance(budget, str) else budget
        if len(layout.kinds) > libbevy.MAX_KINDS:
            raise BevyError(f"{len(layout.kinds)} expert tensor kinds: at most {libbevy.MAX_KINDS} are supported")
        if policy not in libbevy.POLICIES:
            raise BevyError(f"unknown eviction policy {policy!r}: choose one of {', '.join(libbevy.POLICIES)}")
        minimum = layout.min_bytes()
        if budget_bytes < minimum:
            per = " + ".join(f"{layout.min_slots(1)} x {c.alloc_bytes}" for c in layout.classes)
            raise BevyError(f"--expert-cache of {budget_bytes} bytes is below the minimum of {minimum} bytes "
                            f"({layout.top_k} experts of each layer's layout: {per} bytes): raise it")
        self.class_slots = layout.class_slots(budget_bytes)  # per slot class (cache_layout.py)
        self.n_slots = sum(self.class_slots)
        self.min_class_slots = min(self.class_slots)  # what the schedulers' per-layer rules may count on
        # bytes allocated; waste: what the budget given leaves unused (less than a slot per class) and
        # the slots' room for reads that do not start a page (SlotClass.kind_stride)
        self.budget_bytes = sum(n * c.alloc_bytes for n, c in zip(self.class_slots, layout.classes))
        self.wasted_bytes = budget_bytes - sum(n * c.bytes for n, c in zip(self.class_slots, layout.classes))
        self.n_workers = n_workers
        self.wait_timeout_s = wait_timeout_s
        params = libbevy.bevy_cache_default_params()
        params.n_layer, params.n_expert, params.n_kinds = layout.n_layer, layout.n_expert, len(layout.kinds)
        for i, b in enumerate(layout.classes[0].kind_bytes):
            params.kind_bytes[i] = b
        params.n_slots = self.n_slots
        params.n_classes = len(layout.classes)
        for c, (n, sc) in enumerate(zip(self.class_slots, layout.classes)):
            params.class_slots[c] = n
            for i, (b, stride) in enumerate(zip(sc.kind_bytes, sc.strides)):
                params.class_kind_bytes[c][i] = b
                params.class_kind_stride[c][i] = stride
        layer_class = (ctypes.c_int32 * layout.n_layer)(*layout.layer_class)
        params.layer_class = ctypes.cast(layer_class, ctypes.POINTER(ctypes.c_int32))  # copied by bevy_cache_new
        params.policy = libbevy.POLICIES[policy]
        params.n_workers = n_workers
        params.wait_timeout_ms = int(wait_timeout_s * 1000)
        params.seed = seed
        params.external_slots = int(device is not None)
        link_handle = open_link(info, link)
        self.link_name = link_handle.describe()
        self.native: NativeCache | None = NativeCache(params, link_handle)
        for (il, kind), offset in layout.sources.items():
            self.native.set_source(il, kind, offset)
        self.device_slots: DeviceSlots | None = None
        if device is not None:
            if lib is None:
                raise BevyError("an expert cache on a device needs the patched llama_cpp (lib)")
            try:
                self.device_slots = DeviceSlots(lib, device, info, layout, self.class_slots, self.native)
            except BaseException:
                self.close()
                raise
            repack = None  # ggml-cpu's layouts are for host memory: a device's slots hold the file's bytes
        self.store = device or "host"  # where the slots live
        self.repack = repack is not None
        self.repacked = self._repack_slots(info, repack, repacked) if repacked else ()
        # (layer, kind index) whose loads an upload worker lays out from a staging buffer
        self._written = {(il, k) for il in layout.moe_layers for k in range(len(layout.kinds))} if device else {
            (il, layout.kinds.index(kind)) for il, kind in repacked}

    def reads_with_room(self, il: int, kind: int) -> bool:
        """Whether the upload workers read layer il's experts of this kind (index) with room around
        them (a strided slot, or a writer's staging buffer), so that O_DIRECT never bounces them."""
        sc = self.layout.classes[self.layout.layer_class[il]]
        return (il, kind) in self._written or sc.strides[kind] > sc.kind_bytes[kind]

    @staticmethod
    def plan_layout(info: ModelInfo, repack: ModuleType | None = None,
                    device: str | None = None) -> tuple[CacheLayout, dict[tuple[int, str], int]]:
        """The slot layout a cache of these arguments uses (its slot_memory is what --expert-cache
        percentages are shares of), and the expert tensors its upload workers lay out in ggml-cpu's
        repacked layouts: (layer, kind) -> their type id (the others are read straight into slots)."""
        repacked = {}
        if repack is not None and device is None:
            for t in info.expert_tensors:
                type_id = gguf.GGMLQuantizationType[t.ggml_type].value
                if llama_ext.repacks(repack, type_id, *t.ne):
                    repacked[(t.layer, t.kind)] = type_id
        kinds = CacheLayout.kinds_of(info)
        layout = CacheLayout.of(info, straight=lambda il, k: device is None and (il, kinds[k]) not in repacked)
        return layout, repacked

    def _repack_slots(self, info: ModelInfo, llama_cpp: ModuleType,
                      repacked: dict[tuple[int, str], int]) -> tuple[str, ...]:
        """Have the upload workers write the experts that ggml-cpu repacks in its layout; their names."""
        writer = llama_ext.write_repacked_fn(llama_cpp)
        names = []
        for t in info.expert_tensors:
            if (type_id := repacked.get((t.layer, t.kind))) is not None:
                self.native.set_writer(t.layer, self.layout.kinds.index(t.kind), writer, type_id, *t.ne)
                names.append(t.name)
        return tuple(names)

    def holds_every_expert(self) -> bool:
        return all(n >= len(c.layers) * self.layout.n_expert for c, n in zip(self.layout.classes, self.class_slots))

    def fill(self) -> float:
        """Where the cache holds every routed expert, load them all now, as llama.cpp loads every
        weight at start-up, so that no request waits for a cold miss (lookups are not counted, nor
        the wait as a stall); returns the seconds it took (0.0: a smaller cache, which loads on
        demand). A load that fails leaves its expert to load on demand, where its error surfaces."""
        if not self.holds_every_expert():
            return 0.0
        t0 = time.perf_counter()
        layers = list(self.layout.moe_layers)
        n = len(layers)
        experts = [tuple(range(self.layout.n_expert))] * n
        flights = self.flights()
        admit, quiet_s = True, 0.0  # the first pass queues every load, the later ones only look
        with self.not_learning():
            while True:
                flights.fill(layers, experts, [0] * n, [admit] * n, [False] * n)
                self.refresh(0, flights)
                admit = False
                # done: all in; or no load has ended for FILL_QUIET_S (what is left failed or stalls)
                late = time.perf_counter() - t0 > self.wait_timeout_s
                if not any(flights.absent()) or quiet_s >= FILL_QUIET_S or late:
                    break
                quiet_s = 0.0 if self.wait(flights.pass_.version, 100, -1) else quiet_s + 0.1
        self.unreserve_all(0)
        return time.perf_counter() - t0

    # -- contexts ------------------------------------------------------------------------

    def require_slots(self, contexts: int) -> None:
        """Refuse a cache too small for `contexts` contexts of one sequence each decoding one token each."""
        need = self.layout.min_slots(1, contexts)
        if self.min_class_slots < need:
            bytes_needed = sum(need * c.alloc_bytes for c in self.layout.classes)
            held = (f"{self.n_slots} experts" if len(self.class_slots) == 1 else
                    f"{self.min_class_slots} experts of its smallest slot class")
            raise BevyError(f"an expert cache of {self.budget_bytes} bytes holds {held}; "
                            f"{contexts} contexts need at least {need} ({bytes_needed} bytes): "
                            "raise --expert-cache or lower --parallel")

    def enable_prefetch(self, model_path: str) -> None:
        """Give the cache every layer's router, for next-layer prediction."""
        for il, w in router_weights(model_path).items():
            if w.shape[0] != self.layout.n_expert:
                raise BevyError(f"layer {il}'s router has {w.shape[0]} rows, the model {self.layout.n_expert} experts")
            self.native.set_router(il, w)

    def attach(self, ctx: Context, prefetch: bool = False, two_pass: bool = False) -> Hook:
        """Serve ctx's expert matmuls from this cache (a hook of its own, the shared slots) and
        put it behind the cache's compute gate; returns the hook (also ctx.hook). prefetch:
        predict and load the next layer's experts; two_pass: a layer computes the experts that
        are loaded while the others load (llama_ext.set_two_pass)."""
        hook = self.native.new_hook()
        ctx.hook = hook
        hook.set_prefetch(prefetch)
        hook.set_gated(True)
        llama_ext.set_moe_hook(ctx.lib, ctx.ptr, hook.fn, hook.user_data, want_router_in=prefetch)
        layout = self.layout
        # one entry per (layer, kind): each layer reads the slots of its class, in its own type
        tensors = (llama_ext.LlamaMoeCacheTensor * (len(layout.moe_layers) * len(layout.kinds)))()
        for n, il in enumerate(layout.moe_layers):
            c = layout.layer_class[il]
            for i, (kind, nbytes) in enumerate(zip(layout.kinds, layout.classes[c].kind_bytes)):
                t = tensors[n * len(layout.kinds) + i]
                t.kind, t.il, t.n_slots = kind.encode(), il, self.class_slots[c]
                t.repack = int(self.repack)  # the patch repacks exactly where _repack_slots set a writer
                stride = layout.classes[c].strides[i]
                if self.device_slots is not None:
                    t.slots, t.data = self.device_slots.slots(c, i)
                    t.nbytes = nbytes * self.class_slots[c]
                else:  # where the slots have room, the layer's experts start inside them (slot_phase)
                    phase = self.native.slot_phase(il, i)
                    t.data = self.native.slot_data(i, c) + phase
                    t.nbytes = stride * self.class_slots[c] - phase
                    t.stride = stride if stride != nbytes else 0
        if llama_ext.set_moe_cache(ctx.lib, ctx.ptr, tensors, max(self.class_slots)) != 0:
            raise BevyError("llama.cpp refused the expert cache for this model (its log says why)")
        llama_ext.set_two_pass(ctx.lib, ctx.ptr, two_pass)
        ctx.explain_failure = hook.last_error
        return hook

    @contextmanager
    def not_learning(self) -> Iterator[None]:
        """Decodes inside leave the eviction's usage statistics as they were (a calibration's
        repeated tokens would otherwise tell it that their experts are the ones in use: measured,
        3% more loads through a 50% cache afterwards)."""
        self.native.set_learning(False)
        try:
            yield
        finally:
            self.native.set_learning(True)

    def set_concurrency(self, n: int) -> None:
        """How many contexts compute at once (the compute gate's capacity)."""
        self.native.set_concurrency(n)

    def begin(self, ctx: Context, token: int, count_from: int = 0) -> None:
        """Before a decode of ctx: its progress, the first layer whose lookups count, and a turn
        at the compute gate."""
        ctx.hook.begin(token, count_from)

    def end(self, ctx: Context) -> tuple[int, float]:
        """After a decode of ctx: (experts it pinned, summed over its layers; seconds it waited)."""
        return ctx.hook.end()

    # -- scheduling passes (the self-balancing runner) -------------------------------------

    def flights(self) -> Flights:
        """A reusable buffer of one pass's flights."""
        return Flights(self.layout.n_layer)

    def refresh(self, owner: int, flights: Flights) -> None:
        self.native.refresh(owner, flights)

    def wait(self, since: int, timeout_ms: int, il: int) -> bool:
        return self.native.wait(since, timeout_ms, il)

    def unreserve_all(self, owner: int) -> None:
        self.native.unreserve_all(owner)

    # -- state ---------------------------------------------------------------------------

    def trace(self, max_events: int) -> None:
        """Record wait/compute/load events (0: stop)."""
        self.native.trace(max_events)

    def events(self) -> list[tuple[int, int, int, int, int, int]]:
        """(kind, context, layer, expert, t0_ns, t1_ns) recorded since the last call."""
        return self.native.events()

    def counters(self, il: int = -1) -> dict[str, int]:
        """hits, misses, loads, bytes_loaded, evictions, stall_ns, link_busy_ns and the prefetch
        counts (of layer il, or of all), and link_bounced: the link's reads that needed a bounce
        copy (unaligned O_DIRECT; whole link)."""
        return self.native.counters(il) | {"link_bounced": self.native.link.bounced()}

    def staging_pinned(self) -> int:
        """Upload workers' staging buffers in the device's pinned host memory (0: host memory)."""
        return self.native.staging_given() if self.native is not None else 0

    def pinned(self) -> int:
        """Slots pinned right now (0 when no graph runs and nothing is reserved)."""
        return self.native.pinned()

    def version(self) -> int:
        """Moves on by one as each load lands: loads landed between two readings, about."""
        return self.native.version()

    def load_s(self) -> float:
        """The link's recent time per expert load, with its workers overlapping (0 before any)."""
        return self.native.load_s()

    def release_hooks(self) -> None:
        """Free the hooks (their contexts must be gone)."""
        self.native.free_hooks()

    def close(self) -> None:
        """Free the hooks (their contexts must be gone), the cache, then the link."""
        if self.native is not None:
            self.native.close()  # joins the upload workers: nothing writes the device slots after this
            self.native = None
        if self.device_slots is not None:
            self.device_slots.free()
            self.device_slots = None

    def __enter__(self) -> ExpertCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
