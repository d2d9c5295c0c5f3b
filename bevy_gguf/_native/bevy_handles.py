"""Owners of libbevy's handles: each frees its handle once, and in order (a cache frees its hooks,
then itself, then its link). Callers above this module never see a pointer."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_float, c_int32, c_int64, c_uint64
from pathlib import Path

import numpy as np

from bevy_gguf._native import libbevy as lib
from bevy_gguf.errors import BevyError


class Link:
    """How expert bytes reach the cache: O_DIRECT reads of a file, a RAM copy, or a throttle."""

    def __init__(self, handle: lib.BevyLink, what: str) -> None:
        if not handle:
            raise BevyError(f"cannot open the {what} link: {lib.last_error()}")
        self.handle: lib.BevyLink | None = handle

    @classmethod
    def file(cls, path: Path) -> Link:
        return cls(lib.bevy_link_file_new(str(path).encode()), "file")

    @classmethod
    def ram(cls, path: Path, ranges: list[tuple[int, int]]) -> Link:
        """An in-memory copy of the (offset, size) ranges of path, read now."""
        offsets = (c_uint64 * max(len(ranges), 1))(*(r[0] for r in ranges))
        sizes = (c_uint64 * max(len(ranges), 1))(*(r[1] for r in ranges))
        return cls(lib.bevy_link_ram_new(str(path).encode(), offsets, sizes, len(ranges)), "ram")

    def throttle(self, bytes_per_s: float) -> Link:
        """A token bucket over this link, which it takes over."""
        inner, self.handle = self.handle, None
        return Link(lib.bevy_link_throttle_new(inner, bytes_per_s), "throttle")

    def fault(self, error_every: int = 0, short_every: int = 0, stall_every: int = 0, stall_s: float = 0.0) -> Link:
        """Injected faults over this link, which it takes over (tests; see bevy.h)."""
        inner, self.handle = self.handle, None
        return Link(lib.bevy_link_fault_new(inner, error_every, short_every, stall_every, stall_s), "fault")

    def describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lib.bevy_link_describe(self.handle, buf, len(buf))
        return buf.value.decode()

    def bounced(self) -> int:
        return lib.bevy_link_bounced(self.handle)

    def emulated(self) -> bool:
        return lib.bevy_link_emulated(self.handle)

    def read(self, offset: int, dst: np.ndarray, before: int = 0, after: int = 0) -> None:
        """Fill dst (contiguous bytes) from [offset, offset + dst.nbytes) of the slow tier; the
        link may use `before` bytes ahead of dst and `after` past it as scratch (bevy_link_read_padded)."""
        if lib.bevy_link_read_padded(self.handle, offset, dst.nbytes, dst.ctypes.data, before, after) != 0:
            raise BevyError(f"link read failed: {lib.last_error()}")

    def close(self) -> None:
        if self.handle:
            lib.bevy_link_free(self.handle)
        self.handle = None


class Hook:
    """The cache hook of one llama context (install it with llama_ext.set_moe_hook)."""

    def __init__(self, cache: NativeCache) -> None:
        self.handle: lib.BevyHook | None = lib.bevy_hook_new(cache.handle)
        if not self.handle:
            raise BevyError(f"cannot create a cache hook: {lib.last_error()}")
        self._cache = cache
        self._ends = (c_int32 * 1)()
        self._experts = np.zeros(0, dtype=np.int32)
        self._offsets = np.zeros(2, dtype=np.int64)  # n_groups + 1
        self._il = c_int32(-1)
        self._usage = lib.BevyHookUsage()

    @property
    def fn(self) -> int:
        """The hook body's address (llama_moe_hook_fn) and ..."""
        return lib.address_of(lib.bevy_hook_fn)

    @property
    def user_data(self) -> int:
        """... the user_data it takes."""
        return self.handle.value or 0

    def last_error(self) -> str:
        return (lib.bevy_hook_last_error(self.handle) or b"").decode(errors="replace") if self.handle else ""

    def set_gated(self, gated: bool) -> None:
        lib.bevy_hook_set_gated(self.handle, gated)

    def set_gate_weight(self, weight: int) -> None:
        """The share of the gate's capacity the next decodes ask for (the capacity: they compute
        alone); each gets it where the gate is empty at its turn, else 1."""
        lib.bevy_hook_set_gate_weight(self.handle, weight)

    def gate_weight(self) -> int:
        """What the current (or last) decode got at the gate."""
        return lib.bevy_hook_gate_weight(self.handle)

    def set_prefetch(self, on: bool) -> None:
        lib.bevy_hook_set_prefetch(self.handle, on)

    def begin(self, token: int, count_from: int = 0) -> None:
        """Before a decode: its progress, the first layer whose lookups count, a turn at the gate."""
        lib.bevy_hook_begin(self.handle, token, count_from)

    def end(self) -> tuple[int, float]:
        """After a decode: (experts it pinned, distinct per layer summed over its layers; seconds
        its layers waited for experts and the compute gate)."""
        lib.bevy_hook_end(self.handle, self._usage)
        return self._usage.experts, self._usage.wait_ns / 1e9

    def routed(self, row_ends: list[int], k: int) -> tuple[int, list[tuple[int, ...]]]:
        """(layer, per group of rows the sorted distinct experts) of the last route-only call;
        group g is rows [row_ends[g - 1], row_ends[g])."""
        n = len(row_ends)
        if len(self._ends) < n:
            self._ends = (c_int32 * n)()
            self._offsets = np.zeros(n + 1, dtype=np.int64)
        room = row_ends[-1] * k if row_ends else 0
        if len(self._experts) < room:
            self._experts = np.zeros(room, dtype=np.int32)
        self._ends[:n] = row_ends
        got = lib.bevy_hook_routed(self.handle, self._ends, n, self._experts.ctypes.data_as(POINTER(c_int32)),
                                   self._offsets.ctypes.data_as(POINTER(c_int64)), len(self._experts),
                                   ctypes.byref(self._il))
        if got < 0:
            raise BevyError(f"the lookahead saw fewer than {row_ends[-1] if row_ends else 0} tokens")
        flat, off = self._experts[:got].tolist(), self._offsets[: n + 1].tolist()
        return self._il.value, [tuple(flat[off[g]: off[g + 1]]) for g in range(n)]

    def close(self) -> None:
        if self.handle:
            lib.bevy_hook_free(self.handle)
        self.handle = None


def _flight_dtype() -> np.dtype:
    """bevy_flight as a numpy record (the experts pointer as an address), so a pass's flights are
    filled column by column."""
    formats = {"layer": np.int32, "n_experts": np.int32, "experts": np.uint64, "priority": np.uint64,
               "admit": np.uint8, "count": np.uint8, "absent": np.int32, "eta_ns": np.int64}
    names = [name for name, _ in lib.BevyFlight._fields_]
    return np.dtype({"names": names, "formats": [formats[n] for n in names],
                     "offsets": [getattr(lib.BevyFlight, n).offset for n in names],
                     "itemsize": ctypes.sizeof(lib.BevyFlight)})


FLIGHT = _flight_dtype()


class Flights:
    """The flights of one scheduling pass, in native memory (bevy_flight[]), refilled per pass."""

    def __init__(self, n_layer: int) -> None:
        self.rows = np.zeros(0, dtype=FLIGHT)
        self.experts = np.zeros(0, dtype=np.int32)
        self.n = 0
        self.hits, self.misses = (c_uint64 * n_layer)(), (c_uint64 * n_layer)()
        self.pass_ = lib.BevyPass(0, n_layer, self.hits, self.misses, 0)

    def fill(self, layers: list[int], experts: list[tuple[int, ...]], priority: list[int], admit: list[bool],
             count: list[bool]) -> None:
        n = self.n = len(layers)
        if len(self.rows) < n:
            self.rows = np.zeros(n, dtype=FLIGHT)
        sizes = np.fromiter((len(e) for e in experts), dtype=np.int64, count=n)
        flat = [x for e in experts for x in e]
        if len(self.experts) < len(flat):
            self.experts = np.zeros(len(flat), dtype=np.int32)
        self.experts[: len(flat)] = flat
        rows = self.rows[:n]
        rows["layer"], rows["n_experts"] = layers, sizes
        rows["experts"] = self.experts.ctypes.data + 4 * (np.cumsum(sizes) - sizes)
        rows["priority"], rows["admit"], rows["count"], rows["absent"], rows["eta_ns"] = priority, admit, count, 0, 0

    def pointer(self) -> object:
        return self.rows.ctypes.data_as(POINTER(lib.BevyFlight))

    def absent(self) -> list[int]:
        return self.rows["absent"][: self.n].tolist()

    def eta_s(self) -> list[float | None]:
        """Per flight: seconds until its loads land (0: it lacks nothing; None: nothing loads for it)."""
        return [None if t < 0 else t / 1e9 for t in self.rows["eta_ns"][: self.n].tolist()]


class NativeCache:
    """libbevy's expert cache over a link; owns the link and the hooks made from it."""

    def __init__(self, params: lib.BevyCacheParams, link: Link) -> None:
        self.handle: lib.BevyCache | None = lib.bevy_cache_new(ctypes.byref(params), link.handle)
        if not self.handle:
            link.close()
            raise BevyError(f"cannot create the expert cache: {lib.last_error()}")
        self.link = link
        self.hooks: list[Hook] = []
        self._events = (lib.BevyEvent * 4096)()

    def set_source(self, il: int, kind: int, offset: int) -> None:
        if lib.bevy_cache_set_source(self.handle, il, kind, offset) != 0:
            raise BevyError(lib.last_error())

    def set_writer(self, il: int, kind: int, fn: int | None, ggml_type: int, ne0: int, ne1: int) -> None:
        if lib.bevy_cache_set_writer(self.handle, il, kind, fn, ggml_type, ne0, ne1) != 0:
            raise BevyError(lib.last_error())

    def set_staging(self, alloc: int, free: int, user: int) -> None:
        """The upload workers' staging buffers from alloc(user, ...) where it gives some (pinned memory)."""
        if lib.bevy_cache_set_staging(self.handle, alloc, free, user) != 0:
            raise BevyError(lib.last_error())

    def staging_given(self) -> int:
        return lib.bevy_cache_staging_given(self.handle)

    def set_slot_data(self, kind: int, slot_class: int, data: int) -> None:
        """external_slots: the memory of one kind's slots of a class (a device's)."""
        if lib.bevy_cache_set_class_data(self.handle, slot_class, kind, data) != 0:
            raise BevyError(lib.last_error())

    def slot_phase(self, il: int, kind: int) -> int:
        """Where layer il's expert of kind starts inside its slot (bevy_cache_slot_phase)."""
        phase = lib.bevy_cache_slot_phase(self.handle, il, kind)
        if phase < 0:
            raise BevyError(lib.last_error())
        return phase

    def slot_data(self, kind: int, slot_class: int = 0) -> int:
        ptr = lib.bevy_cache_class_data(self.handle, slot_class, kind)
        if not ptr:
            raise BevyError(lib.last_error())
        return ptr

    def set_router(self, il: int, weights: np.ndarray) -> None:
        w = np.ascontiguousarray(weights, dtype=np.float32)
        if lib.bevy_cache_set_router(self.handle, il, w.ctypes.data_as(POINTER(c_float)), w.shape[1]) != 0:
            raise BevyError(lib.last_error())

    def set_concurrency(self, n: int) -> None:
        if lib.bevy_cache_set_concurrency(self.handle, n) != 0:
            raise BevyError(lib.last_error())

    def set_learning(self, on: bool) -> None:
        lib.bevy_cache_set_learning(self.handle, on)

    def context_entries(self) -> int:
        """Entries of the native table of contexts sharing the cache (see bevy.h)."""
        return lib.bevy_cache_context_entries(self.handle)

    def new_hook(self) -> Hook:
        hook = Hook(self)
        self.hooks.append(hook)
        return hook

    def free_hooks(self) -> None:
        for hook in self.hooks:
            hook.close()
        self.hooks.clear()

    def counters(self, il: int = -1) -> dict[str, int]:
        c = lib.BevyCounters()
        if lib.bevy_cache_counters(self.handle, il, ctypes.byref(c)) != 0:
            raise BevyError(lib.last_error())
        return {f: getattr(c, f) for f, _ in lib.BevyCounters._fields_}

    def pinned(self) -> int:
        return lib.bevy_cache_pinned(self.handle)

    def version(self) -> int:
        """Moves on by one as each load lands (bevy_cache_version)."""
        return lib.bevy_cache_version(self.handle)

    def load_s(self) -> float:
        """The recent average time of one load (0 before any)."""
        return lib.bevy_cache_load_ns(self.handle) / 1e9

    def refresh(self, owner: int, flights: Flights) -> None:
        """One scheduling pass (bevy_cache_refresh): sets the flights' absent, the pass's
        version and per-layer lookups."""
        if lib.bevy_cache_refresh(self.handle, owner, flights.pointer(), flights.n, ctypes.byref(flights.pass_)) != 0:
            raise BevyError(f"expert cache refresh failed: {lib.last_error()}")

    def wait(self, since: int, timeout_ms: int, il: int) -> bool:
        """Wait for a load to complete after version since (counted as stall at il); False on timeout."""
        return lib.bevy_cache_wait(self.handle, since, timeout_ms, il) != since

    def unreserve_all(self, owner: int) -> None:
        lib.bevy_cache_unreserve_all(self.handle, owner)

    def trace(self, max_events: int) -> None:
        lib.bevy_cache_trace(self.handle, max_events)

    def events(self) -> list[tuple[int, int, int, int, int, int]]:
        out: list[tuple[int, int, int, int, int, int]] = []
        buf = self._events
        while (n := lib.bevy_cache_events(self.handle, buf, len(buf))) > 0:
            out += [(e.kind, e.context, e.layer, e.expert, e.t0_ns, e.t1_ns) for e in buf[:n]]
        return out

    def close(self) -> None:
        """Free the hooks (their contexts must be gone), the cache, then the link."""
        self.free_hooks()
        if self.handle:
            lib.bevy_cache_free(self.handle)
            self.handle = None
        self.link.close()


class RouterTrace:
    """Records, per layer, the experts each token selected (ids pass through unchanged)."""

    def __init__(self, n_layer: int, k: int) -> None:
        self.n_layer, self.k = n_layer, k
        self.handle: lib.BevyRouterTrace | None = lib.bevy_router_trace_new(n_layer, k)
        if not self.handle:
            raise BevyError("cannot create a router trace")

    @property
    def fn(self) -> int:
        return lib.address_of(lib.bevy_router_trace_hook)

    @property
    def user_data(self) -> int:
        return self.handle.value or 0

    def rows(self, il: int) -> int:
        return lib.bevy_router_trace_rows(self.handle, il)

    def read(self, il: int) -> np.ndarray:
        """[rows, k] expert ids recorded at layer il."""
        n = self.rows(il)
        out = np.zeros((max(n, 0), self.k), dtype=np.int32)
        if n > 0:
            lib.bevy_router_trace_read(self.handle, il, 0, n, out.ctypes.data_as(POINTER(c_int32)))
        return out

    def clear(self) -> None:
        lib.bevy_router_trace_clear(self.handle)

    def close(self) -> None:
        if self.handle:
            lib.bevy_router_trace_free(self.handle)
        self.handle = None

