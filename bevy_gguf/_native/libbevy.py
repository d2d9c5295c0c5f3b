"""ctypes bindings of libbevy (native/include/bevy.h), in llama-cpp-python's style.

One binding per C function, its prototype above it and its return values in the docstring; no
logic here (the handle owners in bevy_handles.py hold it). Handles are typed (a BevyCache where a
bevy_cache * goes: passing another handle, or a bare int, is a TypeError). The library loads on
first import; its structs, enums and counters are checked against bevy_abi() then, so a stale
build is one clear error, not a corrupted call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from ctypes import POINTER, c_bool, c_char_p, c_double, c_float, c_int32, c_int64, c_uint8, c_uint64, c_void_p
from typing import Any, TypeVar

from bevy_gguf.errors import BevyError
from bevy_gguf.paths import lib_dir

F = TypeVar("F", bound=Callable[..., Any])


def _load() -> ctypes.CDLL:
    path = lib_dir("patched") / "libbevy.so"
    if not path.exists():
        raise BevyError(f"{path} is missing: run `make build` first")
    return ctypes.CDLL(str(path))


_lib = _load()


def libbevy() -> ctypes.CDLL:
    """The loaded library (its functions carry the prototypes bound below)."""
    return _lib


def _bind(name: str, argtypes: list[Any], restype: Any) -> Callable[[F], F]:
    """Bind the C function `name` with this prototype; the Python stub gives its docstring."""

    def decorator(stub: F) -> F:
        fn = getattr(_lib, name)
        fn.argtypes, fn.restype = argtypes, restype
        functools.wraps(stub)(fn)
        return fn  # type: ignore[return-value]

    return decorator


class _Handle(c_void_p):
    """An opaque pointer of one kind: only its own kind (or None) converts to it."""

    @classmethod
    def from_param(cls, obj: object) -> object:
        if obj is None or isinstance(obj, cls):
            return obj
        raise TypeError(f"expected a {cls.__name__}, got {type(obj).__name__}")


class BevyLink(_Handle):
    """bevy_link *"""


class BevyCache(_Handle):
    """bevy_cache *"""


class BevyHook(_Handle):
    """bevy_hook *"""


class BevyRouterTrace(_Handle):
    """bevy_router_trace *"""


# -- structs and constants (checked against bevy_abi below) ----------------------------------

class BevyMoeCall(ctypes.Structure):
    """bevy_moe_call (= llama_moe_hook_call of the patch series)."""

    _fields_ = [
        ("il", c_int32),
        ("n_expert", c_int32),
        ("n_expert_used", c_int32),
        ("n_tokens", c_int32),
        ("ids", POINTER(c_int32)),
        ("ids_stride", c_int64),
        ("out", POINTER(c_int32)),
        ("n_out_max", c_int32),
        ("router_in", POINTER(c_float)),
        ("router_in_stride", c_int64),
        ("n_embd", c_int32),
        ("route_only", c_int32),
        ("pass", c_int32),
        ("batch_rows", POINTER(c_int32)),
        ("n_batch_rows", c_int32),
        ("batch_seq", c_int32),
    ]


MAX_KINDS = 8  # BEVY_MAX_KINDS
MAX_CLASSES = 16  # BEVY_MAX_CLASSES


class BevyCacheParams(ctypes.Structure):
    """bevy_cache_params."""

    _fields_ = [
        ("n_layer", c_int32),
        ("n_expert", c_int32),
        ("n_kinds", c_int32),
        ("kind_bytes", c_uint64 * MAX_KINDS),
        ("n_slots", c_int64),
        ("policy", c_int32),
        ("n_workers", c_int32),
        ("wait_timeout_ms", c_int32),
        ("seed", c_uint64),
        ("n_classes", c_int32),
        ("class_slots", c_int64 * MAX_CLASSES),
        ("class_kind_bytes", (c_uint64 * MAX_KINDS) * MAX_CLASSES),
        ("layer_class", POINTER(c_int32)),
        ("external_slots", c_int32),
        ("class_kind_stride", (c_uint64 * MAX_KINDS) * MAX_CLASSES),
    ]


class BevyEvent(ctypes.Structure):
    """bevy_event."""

    _fields_ = [("kind", c_int32), ("context", c_int32), ("layer", c_int32), ("expert", c_int32),
                ("t0_ns", c_int64), ("t1_ns", c_int64)]


class BevyFlight(ctypes.Structure):
    """bevy_flight: a request in flight as a scheduling pass sees it."""

    _fields_ = [("layer", c_int32), ("n_experts", c_int32), ("experts", POINTER(c_int32)), ("priority", c_uint64),
                ("admit", c_uint8), ("count", c_uint8), ("absent", c_int32), ("eta_ns", c_int64)]


class BevyHookUsage(ctypes.Structure):
    """bevy_hook_usage: what a decode used since bevy_hook_begin."""

    _fields_ = [("experts", c_int64), ("wait_ns", c_int64)]


class BevyPass(ctypes.Structure):
    """bevy_pass: what a scheduling pass learns beyond its flights."""

    _fields_ = [("version", c_uint64), ("n_layer", c_int32), ("hits", POINTER(c_uint64)),
                ("misses", POINTER(c_uint64)), ("load_ns", c_int64)]


POLICIES = {"lru": 0, "next-use": 1, "random": 2}  # enum bevy_policy
EVENT_WAIT, EVENT_COMPUTE, EVENT_LOAD = 0, 1, 2    # enum bevy_event_kind
DENSE_LAYER = -1  # BEVY_DENSE_LAYER: the class of a layer without routed experts
_CONSTANTS = {"BEVY_MAX_KINDS": MAX_KINDS, "BEVY_MAX_CLASSES": MAX_CLASSES, "BEVY_DENSE_LAYER": DENSE_LAYER,
              "BEVY_POLICY_LRU": POLICIES["lru"],
              "BEVY_POLICY_NEXT_USE": POLICIES["next-use"], "BEVY_POLICY_RANDOM": POLICIES["random"],
              "BEVY_EVENT_WAIT": EVENT_WAIT, "BEVY_EVENT_COMPUTE": EVENT_COMPUTE, "BEVY_EVENT_LOAD": EVENT_LOAD}

# typedef int32_t (*bevy_moe_hook_fn)(void * user_data, const bevy_moe_call * call);
MOE_HOOK_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, POINTER(BevyMoeCall))


# -- ABI ---------------------------------------------------------------------------------------

# int64_t bevy_abi(const char * what);
@_bind("bevy_abi", [c_char_p], c_int64)
def bevy_abi(what: bytes, /) -> int:
    """The value of "sizeof:T", "offsetof:T.F" or a constant's name; -1 for an unknown name."""
    ...


# const char * bevy_counter_name(int32_t i);
@_bind("bevy_counter_name", [c_int32], c_char_p)
def bevy_counter_name(i: int, /) -> bytes | None:
    """The name of counter i in struct order (BEVY_COUNTERS), or None past the last."""
    ...


def _counter_fields() -> list[tuple[str, Any]]:
    names, i = [], 0
    while (name := bevy_counter_name(i)) is not None:
        names.append((name.decode(), c_uint64))
        i += 1
    return names


class BevyCounters(ctypes.Structure):
    """bevy_counters: its fields are bevy.h's BEVY_COUNTERS list, read from the library."""

    _fields_ = _counter_fields()


STRUCTS = {"bevy_moe_call": BevyMoeCall, "bevy_cache_params": BevyCacheParams, "bevy_event": BevyEvent,
           "bevy_counters": BevyCounters, "bevy_flight": BevyFlight, "bevy_pass": BevyPass,
           "bevy_hook_usage": BevyHookUsage}


def abi_mismatches(structs: dict[str, Any], constants: dict[str, int]) -> list[str]:
    """What of these ctypes structs (by C name) and constants the library defines otherwise."""
    wrong = [name for name, value in constants.items() if bevy_abi(name.encode()) != value]
    for c_name, struct in structs.items():
        if bevy_abi(f"sizeof:{c_name}".encode()) != ctypes.sizeof(struct):
            wrong.append(f"sizeof {c_name}")
        for field, *_ in struct._fields_:
            if bevy_abi(f"offsetof:{c_name}.{field}".encode()) not in (-1, getattr(struct, field).offset):
                wrong.append(f"{c_name}.{field}")
    return wrong


if _wrong := abi_mismatches(STRUCTS, _CONSTANTS):
    raise BevyError(f"libbevy and bevy_gguf disagree on {', '.join(_wrong)}: rebuild with `make build`")


# -- errors ------------------------------------------------------------------------------------

# const char * bevy_last_error(void);
@_bind("bevy_last_error", [], c_char_p)
def bevy_last_error() -> bytes:
    """Why this thread's last failed call failed."""
    ...


def last_error() -> str:
    return (bevy_last_error() or b"").decode(errors="replace")


# -- router trace ------------------------------------------------------------------------------

# bevy_router_trace * bevy_router_trace_new(int32_t n_layer, int32_t k);
@_bind("bevy_router_trace_new", [c_int32, c_int32], BevyRouterTrace)
def bevy_router_trace_new(n_layer: int, k: int, /) -> BevyRouterTrace:
    """A trace of n_layer layers, k experts per token; NULL on bad arguments."""
    ...


# void bevy_router_trace_free(bevy_router_trace * trace);
@_bind("bevy_router_trace_free", [BevyRouterTrace], None)
def bevy_router_trace_free(trace: BevyRouterTrace, /) -> None: ...


# int32_t bevy_router_trace_hook(void * trace, const bevy_moe_call * call);
@_bind("bevy_router_trace_hook", [c_void_p, POINTER(BevyMoeCall)], c_int32)
def bevy_router_trace_hook(trace: int, call: Any, /) -> int:
    """The hook body (pass its address to llama_set_moe_hook): 0, or -1 on a layer or k mismatch."""
    ...


# int64_t bevy_router_trace_rows(bevy_router_trace * trace, int32_t il);
@_bind("bevy_router_trace_rows", [BevyRouterTrace, c_int32], c_int64)
def bevy_router_trace_rows(trace: BevyRouterTrace, il: int, /) -> int:
    """Rows (tokens) recorded for layer il, in batch order; -1 for a bad layer."""
    ...


# int64_t bevy_router_trace_read(bevy_router_trace *, int32_t il, int64_t first, int64_t n, int32_t * out);
@_bind("bevy_router_trace_read", [BevyRouterTrace, c_int32, c_int64, c_int64, POINTER(c_int32)], c_int64)
def bevy_router_trace_read(trace: BevyRouterTrace, il: int, first: int, n: int, out: Any, /) -> int:
    """Copies rows [first, first + n) of layer il (n*k ids); rows copied, or -1."""
    ...


# void bevy_router_trace_clear(bevy_router_trace * trace);
@_bind("bevy_router_trace_clear", [BevyRouterTrace], None)
def bevy_router_trace_clear(trace: BevyRouterTrace, /) -> None: ...


# -- links -------------------------------------------------------------------------------------

# bevy_link * bevy_link_file_new(const char * path);
@_bind("bevy_link_file_new", [c_char_p], BevyLink)
def bevy_link_file_new(path: bytes, /) -> BevyLink:
    """O_DIRECT preads of path (buffered where refused); NULL on failure (bevy_last_error)."""
    ...


# bevy_link * bevy_link_ram_new(const char * path, const uint64_t * offsets, const uint64_t * sizes, int32_t n);
@_bind("bevy_link_ram_new", [c_char_p, POINTER(c_uint64), POINTER(c_uint64), c_int32], BevyLink)
def bevy_link_ram_new(path: bytes, offsets: Any, sizes: Any, n: int, /) -> BevyLink:
    """An in-memory copy of n ranges of path, read now; NULL on failure."""
    ...


# bevy_link * bevy_link_throttle_new(bevy_link * inner, double bytes_per_s);
@_bind("bevy_link_throttle_new", [BevyLink, c_double], BevyLink)
def bevy_link_throttle_new(inner: BevyLink, bytes_per_s: float, /) -> BevyLink:
    """A token bucket over inner, which it takes over (do not free inner); NULL on failure."""
    ...


# bevy_link * bevy_link_fault_new(bevy_link * inner, int64_t error_every, int64_t short_every,
#                                 int64_t stall_every, double stall_s);
@_bind("bevy_link_fault_new", [BevyLink, c_int64, c_int64, c_int64, c_double], BevyLink)
def bevy_link_fault_new(inner: BevyLink, error_every: int, short_every: int, stall_every: int, stall_s: float,
                        /) -> BevyLink:
    """Injected faults over inner, which it takes over (see bevy.h); NULL on failure."""
    ...


# void bevy_link_free(bevy_link * link);
@_bind("bevy_link_free", [BevyLink], None)
def bevy_link_free(link: BevyLink, /) -> None: ...


# int64_t bevy_link_describe(const bevy_link * link, char * buf, int64_t size);
@_bind("bevy_link_describe", [BevyLink, c_char_p, c_int64], c_int64)
def bevy_link_describe(link: BevyLink, buf: Any, size: int, /) -> int:
    """Writes the one-line description into buf (truncated); returns its full length."""
    ...


# bool bevy_link_emulated(const bevy_link * link);
@_bind("bevy_link_emulated", [BevyLink], c_bool)
def bevy_link_emulated(link: BevyLink, /) -> bool:
    """True for an emulated link (a throttle)."""
    ...


# uint64_t bevy_link_bounced(const bevy_link * link);
@_bind("bevy_link_bounced", [BevyLink], c_uint64)
def bevy_link_bounced(link: BevyLink, /) -> int:
    """Reads so far that went through a bounce buffer (unaligned O_DIRECT)."""
    ...


# int32_t bevy_link_read(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst);
@_bind("bevy_link_read", [BevyLink, c_uint64, c_uint64, c_void_p], c_int32)
def bevy_link_read(link: BevyLink, offset: int, nbytes: int, dst: Any, /) -> int:
    """Copies [offset, offset + nbytes) of the slow tier to dst: 0, or -1 (bevy_last_error)."""
    ...


# int32_t bevy_link_read_padded(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst, uint64_t before,
#                               uint64_t after);
@_bind("bevy_link_read_padded", [BevyLink, c_uint64, c_uint64, c_void_p, c_uint64, c_uint64], c_int32)
def bevy_link_read_padded(link: BevyLink, offset: int, nbytes: int, dst: Any, before: int, after: int, /) -> int:
    """bevy_link_read with `before` / `after` bytes of scratch around dst (an O_DIRECT read of a
    range that does not start a page then goes straight in): 0, or -1."""
    ...


# -- expert cache ------------------------------------------------------------------------------

# bevy_cache_params bevy_cache_default_params(void);
@_bind("bevy_cache_default_params", [], BevyCacheParams)
def bevy_cache_default_params() -> BevyCacheParams: ...


# bevy_cache * bevy_cache_new(const bevy_cache_params * params, bevy_link * link);
@_bind("bevy_cache_new", [POINTER(BevyCacheParams), BevyLink], BevyCache)
def bevy_cache_new(params: Any, link: BevyLink, /) -> BevyCache:
    """A cache over link (borrowed: it must outlive the cache); NULL on failure (bevy_last_error)."""
    ...


# void bevy_cache_free(bevy_cache * cache);
@_bind("bevy_cache_free", [BevyCache], None)
def bevy_cache_free(cache: BevyCache, /) -> None: ...


# int32_t bevy_cache_set_source(bevy_cache * cache, int32_t il, int32_t kind, uint64_t offset);
@_bind("bevy_cache_set_source", [BevyCache, c_int32, c_int32, c_uint64], c_int32)
def bevy_cache_set_source(cache: BevyCache, il: int, kind: int, offset: int, /) -> int:
    """Expert e of kind at layer il lies at offset + e * kind_bytes: 0, or -1 (out of range)."""
    ...


# int32_t bevy_cache_set_writer(bevy_cache * cache, int32_t il, int32_t kind, bevy_slot_writer_fn fn,
#                               int32_t type, int64_t ne0, int64_t ne1);
@_bind("bevy_cache_set_writer", [BevyCache, c_int32, c_int32, c_void_p, c_int32, c_int64, c_int64], c_int32)
def bevy_cache_set_writer(cache: BevyCache, il: int, kind: int, fn: int | None, ggml_type: int, ne0: int, ne1: int,
                          /) -> int:
    """Experts of kind at layer il go through a staging buffer and fn(type, ne0, ne1, dst, src, nbytes)
    into their slot (fn None: read straight in): 0, or -1 (out of range)."""
    ...


# int64_t bevy_cache_slot_phase(const bevy_cache * cache, int32_t il, int32_t kind);
@_bind("bevy_cache_slot_phase", [BevyCache, c_int32, c_int32], c_int64)
def bevy_cache_slot_phase(cache: BevyCache, il: int, kind: int, /) -> int:
    """Where layer il's expert of kind starts inside its slot (its file offset modulo a page where
    the slot's stride leaves room for an O_DIRECT read of its aligned superset, else 0); -1 on a bad
    layer or kind."""
    ...


# void * bevy_cache_class_data(bevy_cache * cache, int32_t c, int32_t kind);
@_bind("bevy_cache_class_data", [BevyCache, c_int32, c_int32], c_void_p)
def bevy_cache_class_data(cache: BevyCache, c: int, kind: int, /) -> int | None:
    """The slots of one kind of slot class c (its slot s at + (s - its first) * its kind stride)."""
    ...


# int32_t bevy_cache_set_staging(bevy_cache * cache, bevy_staging_alloc_fn alloc, bevy_staging_free_fn free,
#                                void * user);
@_bind("bevy_cache_set_staging", [BevyCache, c_void_p, c_void_p, c_void_p], c_int32)
def bevy_cache_set_staging(cache: BevyCache, alloc: int | None, free: int | None, user: int | None, /) -> int:
    """The workers' staging buffers from alloc(user, nbytes, &handle) (NULL: host memory), freed with
    free(handle): 0, or -1 (one of them missing)."""
    ...


# int64_t bevy_cache_staging_given(const bevy_cache * cache);
@_bind("bevy_cache_staging_given", [BevyCache], c_int64)
def bevy_cache_staging_given(cache: BevyCache, /) -> int:
    """Staging buffers the staging allocator gave so far."""
    ...


# int32_t bevy_cache_set_class_data(bevy_cache * cache, int32_t c, int32_t kind, void * data);
@_bind("bevy_cache_set_class_data", [BevyCache, c_int32, c_int32, c_void_p], c_int32)
def bevy_cache_set_class_data(cache: BevyCache, c: int, kind: int, data: int, /) -> int:
    """external_slots: where one kind's slots of class c live: 0, or -1 (out of range, or own slots)."""
    ...


# int32_t bevy_cache_counters(const bevy_cache * cache, int32_t il, bevy_counters * out);
@_bind("bevy_cache_counters", [BevyCache, c_int32, POINTER(BevyCounters)], c_int32)
def bevy_cache_counters(cache: BevyCache, il: int, out: Any, /) -> int:
    """Layer il's counters (-1: totals): 0, or -1 on a bad layer."""
    ...


# int64_t bevy_cache_pinned(const bevy_cache * cache);
@_bind("bevy_cache_pinned", [BevyCache], c_int64)
def bevy_cache_pinned(cache: BevyCache, /) -> int:
    """Slots pinned right now."""
    ...


# int32_t bevy_cache_set_concurrency(bevy_cache * cache, int32_t n);
@_bind("bevy_cache_set_concurrency", [BevyCache, c_int32], c_int32)
def bevy_cache_set_concurrency(cache: BevyCache, n: int, /) -> int:
    """Gated contexts computing at once: 0, or -1 unless n > 0."""
    ...


# void bevy_cache_set_learning(bevy_cache * cache, bool on);
@_bind("bevy_cache_set_learning", [BevyCache, c_bool], None)
def bevy_cache_set_learning(cache: BevyCache, on: bool, /) -> None:
    """Off: hook calls leave the eviction's usage statistics as they are (calibrations)."""
    ...


# int32_t bevy_cache_context_entries(const bevy_cache * cache);
@_bind("bevy_cache_context_entries", [BevyCache], c_int32)
def bevy_cache_context_entries(cache: BevyCache, /) -> int:
    """Entries of the cache's context table: at most the hooks ever alive at once."""
    ...


# int32_t bevy_cache_refresh(bevy_cache * cache, int32_t owner, bevy_flight * flights, int32_t n, bevy_pass * pass);
@_bind("bevy_cache_refresh", [BevyCache, c_int32, POINTER(BevyFlight), c_int32, POINTER(BevyPass)], c_int32)
def bevy_cache_refresh(cache: BevyCache, owner: int, flights: Any, n: int, pass_: Any, /) -> int:
    """One scheduling pass of an owner over its n flights (see bevy.h); sets each flight's absent
    and the pass: 0, or -1 (nothing changed) on a bad owner, layer or expert."""
    ...


# void bevy_cache_lookups(const bevy_cache * cache, uint64_t * hits, uint64_t * misses, int32_t n_layer);
@_bind("bevy_cache_lookups", [BevyCache, POINTER(c_uint64), POINTER(c_uint64), c_int32], None)
def bevy_cache_lookups(cache: BevyCache, hits: Any, misses: Any, n_layer: int, /) -> None:
    """Per layer: lookups that hit and that missed so far."""
    ...


# uint64_t bevy_cache_version(const bevy_cache * cache);
@_bind("bevy_cache_version", [BevyCache], c_uint64)
def bevy_cache_version(cache: BevyCache, /) -> int:
    """Changes whenever a load completes."""
    ...


# int64_t bevy_cache_load_ns(const bevy_cache * cache);
@_bind("bevy_cache_load_ns", [BevyCache], c_int64)
def bevy_cache_load_ns(cache: BevyCache, /) -> int:
    """The recent average time of one load, in ns (0 before any)."""
    ...


# uint64_t bevy_cache_wait(bevy_cache * cache, uint64_t since, int32_t timeout_ms, int32_t il);
@_bind("bevy_cache_wait", [BevyCache, c_uint64, c_int32, c_int32], c_uint64)
def bevy_cache_wait(cache: BevyCache, since: int, timeout_ms: int, il: int, /) -> int:
    """Waits until the version differs from since or timeout_ms passed (stall at il); returns
    the version then (since: timed out)."""
    ...


# void bevy_cache_unreserve_all(bevy_cache * cache, int32_t owner);
@_bind("bevy_cache_unreserve_all", [BevyCache, c_int32], None)
def bevy_cache_unreserve_all(cache: BevyCache, owner: int, /) -> None: ...


# void bevy_cache_trace(bevy_cache * cache, int64_t max_events);
@_bind("bevy_cache_trace", [BevyCache, c_int64], None)
def bevy_cache_trace(cache: BevyCache, max_events: int, /) -> None:
    """Record up to max_events events (0: stop)."""
    ...


# int64_t bevy_cache_events(bevy_cache * cache, bevy_event * out, int64_t max);
@_bind("bevy_cache_events", [BevyCache, POINTER(BevyEvent), c_int64], c_int64)
def bevy_cache_events(cache: BevyCache, out: Any, max_events: int, /) -> int:
    """Moves up to max recorded events into out, oldest first; returns how many."""
    ...


# int32_t bevy_cache_set_router(bevy_cache * cache, int32_t il, const float * weights, int32_t n_embd);
@_bind("bevy_cache_set_router", [BevyCache, c_int32, POINTER(c_float), c_int32], c_int32)
def bevy_cache_set_router(cache: BevyCache, il: int, weights: Any, n_embd: int, /) -> int:
    """Layer il's router [n_expert][n_embd] (copied), for prefetch: 0, or -1."""
    ...


# int64_t bevy_now_ns(void);
@_bind("bevy_now_ns", [], c_int64)
def bevy_now_ns() -> int:
    """CLOCK_MONOTONIC nanoseconds (the events' clock)."""
    ...


# -- hooks -------------------------------------------------------------------------------------

# bevy_hook * bevy_hook_new(bevy_cache * cache);
@_bind("bevy_hook_new", [BevyCache], BevyHook)
def bevy_hook_new(cache: BevyCache, /) -> BevyHook:
    """A hook for one context; NULL on failure."""
    ...


# void bevy_hook_free(bevy_hook * hook);
@_bind("bevy_hook_free", [BevyHook], None)
def bevy_hook_free(hook: BevyHook, /) -> None: ...


# int32_t bevy_hook_fn(void * hook, const bevy_moe_call * call);
@_bind("bevy_hook_fn", [c_void_p, POINTER(BevyMoeCall)], c_int32)
def bevy_hook_fn(hook: int, call: Any, /) -> int:
    """The hook body (pass its address to llama_set_moe_hook): 0, or -1 (bevy_hook_last_error)."""
    ...


# const char * bevy_hook_last_error(const bevy_hook * hook);
@_bind("bevy_hook_last_error", [BevyHook], c_char_p)
def bevy_hook_last_error(hook: BevyHook, /) -> bytes:
    """Why the hook's last call failed (empty if it did not)."""
    ...


# void bevy_hook_set_gated(bevy_hook * hook, bool gated);
@_bind("bevy_hook_set_gated", [BevyHook, c_bool], None)
def bevy_hook_set_gated(hook: BevyHook, gated: bool, /) -> None: ...


# void bevy_hook_set_gate_weight(bevy_hook * hook, int32_t weight);
@_bind("bevy_hook_set_gate_weight", [BevyHook, c_int32], None)
def bevy_hook_set_gate_weight(hook: BevyHook, weight: int, /) -> None:
    """The share of the gate's capacity the hook's next decodes ask for (the capacity: alone)."""


# int32_t bevy_hook_gate_weight(const bevy_hook * hook);
@_bind("bevy_hook_gate_weight", [BevyHook], c_int32)
def bevy_hook_gate_weight(hook: BevyHook, /) -> int:
    """The weight the current (or last) decode got at the gate."""


# void bevy_hook_begin(bevy_hook * hook, int64_t token, int32_t count_from);
@_bind("bevy_hook_begin", [BevyHook, c_int64, c_int32], None)
def bevy_hook_begin(hook: BevyHook, token: int, count_from: int, /) -> None:
    """Before a decode: the token it decodes, the first layer whose lookups it counts (0: all),
    and a turn at the compute gate."""
    ...


# void bevy_hook_end(bevy_hook * hook, bevy_hook_usage * usage);
@_bind("bevy_hook_end", [BevyHook, POINTER(BevyHookUsage)], None)
def bevy_hook_end(hook: BevyHook, usage: Any, /) -> None:
    """After a decode (idempotent); usage (or None): the experts it pinned since bevy_hook_begin
    (per layer, summed) and the time its layers waited."""
    ...


# int64_t bevy_hook_routed(const bevy_hook * hook, const int32_t * row_ends, int32_t n_groups,
#                          int32_t * experts, int64_t * offsets, int64_t max_experts, int32_t * il);
@_bind("bevy_hook_routed", [BevyHook, POINTER(c_int32), c_int32, POINTER(c_int32), POINTER(c_int64), c_int64,
                            POINTER(c_int32)], c_int64)
def bevy_hook_routed(hook: BevyHook, row_ends: Any, n_groups: int, experts: Any, offsets: Any, max_experts: int,
                     il: Any, /) -> int:
    """The last route-only call's distinct experts per group of rows (ascending, at
    experts[offsets[g]:offsets[g + 1]]), *il its layer; experts written, or -1 when the rows or
    the room do not match the call."""
    ...


# void bevy_hook_set_prefetch(bevy_hook * hook, bool enable);
@_bind("bevy_hook_set_prefetch", [BevyHook, c_bool], None)
def bevy_hook_set_prefetch(hook: BevyHook, enable: bool, /) -> None: ...


# -- replay ------------------------------------------------------------------------------------

# int64_t bevy_replay(int32_t policy, int32_t n_layer, int32_t n_expert, int64_t n_slots, uint64_t seed,
#                     const int32_t * layers, const int64_t * offsets, const int32_t * experts, int64_t n_steps);
@_bind("bevy_replay", [c_int32, c_int32, c_int32, c_int64, c_uint64, POINTER(c_int32), POINTER(c_int64),
                       POINTER(c_int32), c_int64], c_int64)
def bevy_replay(policy: int, n_layer: int, n_expert: int, n_slots: int, seed: int, layers: Any, offsets: Any,
                experts: Any, n_steps: int, /) -> int:
    """A policy's hits on a recorded order, by the live cache's code; -1 when a step needs more
    experts than there are slots."""
    ...


def address_of(fn: Any) -> int:
    """The C address of a libbevy function, to pass as a llama_moe_hook_fn."""
    return ctypes.cast(fn, c_void_p).value or 0
