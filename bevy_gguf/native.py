"""Thin ctypes bindings: libbevy (native/include/bevy.h) and the patched libllama's hook setter.

One binding per C function, its prototype above it; no logic here.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_bool, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint8, c_uint64, c_void_p
from functools import cache
from types import ModuleType

from bevy_gguf.errors import BevyError
from bevy_gguf.paths import lib_dir


class BevyMoeCall(ctypes.Structure):
    """bevy_moe_call (= llama_moe_hook_call of patches/0001)."""

    _fields_ = [
        ("il", c_int32),
        ("n_expert", c_int32),
        ("n_expert_used", c_int32),
        ("n_tokens", c_int32),
        ("ids", POINTER(c_int32)),
        ("ids_stride", c_int64),
        ("out", POINTER(c_int32)),
        ("n_out_max", c_int32),
        ("router_in", POINTER(ctypes.c_float)),
        ("router_in_stride", c_int64),
        ("n_embd", c_int32),
        ("route_only", c_int32),
    ]


MAX_KINDS = 8


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
    ]


class BevyCounters(ctypes.Structure):
    """bevy_counters."""

    _fields_ = [
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("loads", c_uint64),
        ("bytes_loaded", c_uint64),
        ("evictions", c_uint64),
        ("stall_ns", c_uint64),
        ("link_busy_ns", c_uint64),
        ("prefetch_loads", c_uint64),
        ("prefetch_hits", c_uint64),
        ("prefetch_wasted", c_uint64),
        ("prefetch_missed", c_uint64),
        ("compute_busy_ns", c_uint64),
    ]


class BevyEvent(ctypes.Structure):
    """bevy_event."""

    _fields_ = [("kind", c_int32), ("context", c_int32), ("layer", c_int32), ("expert", c_int32),
                ("t0_ns", c_int64), ("t1_ns", c_int64)]


EVENT_WAIT, EVENT_COMPUTE, EVENT_LOAD = 0, 1, 2


class LlamaMoeCacheTensor(ctypes.Structure):
    """llama_moe_cache_tensor (patches/0002)."""

    _fields_ = [("kind", c_char_p), ("data", c_void_p), ("nbytes", c_size_t)]


POLICIES = {"lru": 0, "next-use": 1, "random": 2}

# typedef int32_t (*bevy_moe_hook_fn)(void * user_data, const bevy_moe_call * call);
MOE_HOOK_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, POINTER(BevyMoeCall))


@cache
def libbevy() -> ctypes.CDLL:
    path = lib_dir("patched") / "libbevy.so"
    if not path.exists():
        raise BevyError(f"{path} is missing: run `make build` first")
    lib = ctypes.CDLL(str(path))

    # bevy_router_trace * bevy_router_trace_new(int32_t n_layer, int32_t k);
    lib.bevy_router_trace_new.argtypes = [c_int32, c_int32]
    lib.bevy_router_trace_new.restype = c_void_p
    # void bevy_router_trace_free(bevy_router_trace * trace);
    lib.bevy_router_trace_free.argtypes = [c_void_p]
    lib.bevy_router_trace_free.restype = None
    # int32_t bevy_router_trace_hook(void * trace, const bevy_moe_call * call);
    lib.bevy_router_trace_hook.argtypes = [c_void_p, POINTER(BevyMoeCall)]
    lib.bevy_router_trace_hook.restype = c_int32
    # int64_t bevy_router_trace_rows(const bevy_router_trace * trace, int32_t il);
    lib.bevy_router_trace_rows.argtypes = [c_void_p, c_int32]
    lib.bevy_router_trace_rows.restype = c_int64
    # int64_t bevy_router_trace_read(const bevy_router_trace *, int32_t il, int64_t first, int64_t n, int32_t * out);
    lib.bevy_router_trace_read.argtypes = [c_void_p, c_int32, c_int64, c_int64, POINTER(c_int32)]
    lib.bevy_router_trace_read.restype = c_int64
    # void bevy_router_trace_clear(bevy_router_trace * trace);
    lib.bevy_router_trace_clear.argtypes = [c_void_p]
    lib.bevy_router_trace_clear.restype = None

    # const char * bevy_last_error(void);
    lib.bevy_last_error.argtypes = []
    lib.bevy_last_error.restype = c_char_p
    # bevy_link * bevy_link_file_new(const char * path);
    lib.bevy_link_file_new.argtypes = [c_char_p]
    lib.bevy_link_file_new.restype = c_void_p
    # bevy_link * bevy_link_ram_new(const char * path, const uint64_t * offsets, const uint64_t * sizes, int32_t n);
    lib.bevy_link_ram_new.argtypes = [c_char_p, POINTER(c_uint64), POINTER(c_uint64), c_int32]
    lib.bevy_link_ram_new.restype = c_void_p
    # bevy_link * bevy_link_throttle_new(bevy_link * inner, double bytes_per_s);
    lib.bevy_link_throttle_new.argtypes = [c_void_p, c_double]
    lib.bevy_link_throttle_new.restype = c_void_p
    # void bevy_link_free(bevy_link * link);
    lib.bevy_link_free.argtypes = [c_void_p]
    lib.bevy_link_free.restype = None
    # int32_t bevy_link_describe(const bevy_link * link, char * buf, int32_t size);
    lib.bevy_link_describe.argtypes = [c_void_p, c_char_p, c_int32]
    lib.bevy_link_describe.restype = c_int32
    # int32_t bevy_link_read(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst);
    lib.bevy_link_read.argtypes = [c_void_p, c_uint64, c_uint64, c_void_p]
    lib.bevy_link_read.restype = c_int32
    # int32_t bevy_link_emulated(const bevy_link * link);
    lib.bevy_link_emulated.argtypes = [c_void_p]
    lib.bevy_link_emulated.restype = c_int32
    # uint64_t bevy_link_bounced(const bevy_link * link);
    lib.bevy_link_bounced.argtypes = [c_void_p]
    lib.bevy_link_bounced.restype = c_uint64
    # bevy_cache_params bevy_cache_default_params(void);
    lib.bevy_cache_default_params.argtypes = []
    lib.bevy_cache_default_params.restype = BevyCacheParams
    # bevy_cache * bevy_cache_new(const bevy_cache_params * params, bevy_link * link);
    lib.bevy_cache_new.argtypes = [POINTER(BevyCacheParams), c_void_p]
    lib.bevy_cache_new.restype = c_void_p
    # void bevy_cache_free(bevy_cache * cache);
    lib.bevy_cache_free.argtypes = [c_void_p]
    lib.bevy_cache_free.restype = None
    # int32_t bevy_cache_set_source(bevy_cache * cache, int32_t il, int32_t kind, uint64_t offset);
    lib.bevy_cache_set_source.argtypes = [c_void_p, c_int32, c_int32, c_uint64]
    lib.bevy_cache_set_source.restype = c_int32
    # void * bevy_cache_slot_data(bevy_cache * cache, int32_t kind);
    lib.bevy_cache_slot_data.argtypes = [c_void_p, c_int32]
    lib.bevy_cache_slot_data.restype = c_void_p
    # int32_t bevy_cache_counters(const bevy_cache * cache, int32_t il, bevy_counters * out);
    lib.bevy_cache_counters.argtypes = [c_void_p, c_int32, POINTER(BevyCounters)]
    lib.bevy_cache_counters.restype = c_int32
    # int64_t bevy_cache_pinned(const bevy_cache * cache);
    lib.bevy_cache_pinned.argtypes = [c_void_p]
    lib.bevy_cache_pinned.restype = c_int64
    # bevy_hook * bevy_hook_new(bevy_cache * cache);
    lib.bevy_hook_new.argtypes = [c_void_p]
    lib.bevy_hook_new.restype = c_void_p
    # void bevy_hook_free(bevy_hook * hook);
    lib.bevy_hook_free.argtypes = [c_void_p]
    lib.bevy_hook_free.restype = None
    # int32_t bevy_hook_fn(void * hook, const bevy_moe_call * call);
    lib.bevy_hook_fn.argtypes = [c_void_p, POINTER(BevyMoeCall)]
    lib.bevy_hook_fn.restype = c_int32
    # const char * bevy_hook_last_error(const bevy_hook * hook);
    lib.bevy_hook_last_error.argtypes = [c_void_p]
    lib.bevy_hook_last_error.restype = c_char_p
    # int32_t bevy_cache_set_concurrency(bevy_cache * cache, int32_t n);
    lib.bevy_cache_set_concurrency.argtypes = [c_void_p, c_int32]
    lib.bevy_cache_set_concurrency.restype = c_int32
    # int32_t bevy_hook_set_gated(bevy_hook * hook, int32_t gated);
    lib.bevy_hook_set_gated.argtypes = [c_void_p, c_int32]
    lib.bevy_hook_set_gated.restype = c_int32
    # void bevy_cache_trace(bevy_cache * cache, int64_t max_events);
    lib.bevy_cache_trace.argtypes = [c_void_p, c_int64]
    lib.bevy_cache_trace.restype = None
    # int64_t bevy_cache_events(bevy_cache * cache, bevy_event * out, int64_t max);
    lib.bevy_cache_events.argtypes = [c_void_p, POINTER(BevyEvent), c_int64]
    lib.bevy_cache_events.restype = c_int64
    # int32_t bevy_cache_refresh(bevy_cache * cache, int32_t owner, int32_t n, const int32_t * layers,
    #                            const int64_t * offsets, const int32_t * experts, const uint8_t * admit,
    #                            const uint64_t * priority, const uint8_t * count, int32_t * absent);
    lib.bevy_cache_refresh.argtypes = [c_void_p, c_int32, c_int32, POINTER(c_int32), POINTER(c_int64), POINTER(c_int32),
                                       POINTER(c_uint8), POINTER(c_uint64), POINTER(c_uint8), POINTER(c_int32)]
    lib.bevy_cache_refresh.restype = c_int32
    # void bevy_cache_lookups(const bevy_cache * cache, uint64_t * hits, uint64_t * misses, int32_t n_layer);
    lib.bevy_cache_lookups.argtypes = [c_void_p, POINTER(c_uint64), POINTER(c_uint64), c_int32]
    lib.bevy_cache_lookups.restype = None
    # uint64_t bevy_cache_version(const bevy_cache * cache);
    lib.bevy_cache_version.argtypes = [c_void_p]
    lib.bevy_cache_version.restype = c_uint64
    # int32_t bevy_cache_wait(bevy_cache * cache, uint64_t since, int32_t timeout_ms, int32_t il);
    lib.bevy_cache_wait.argtypes = [c_void_p, c_uint64, c_int32, c_int32]
    lib.bevy_cache_wait.restype = c_int32
    # void bevy_cache_unreserve_all(bevy_cache * cache, int32_t owner);
    lib.bevy_cache_unreserve_all.argtypes = [c_void_p, c_int32]
    lib.bevy_cache_unreserve_all.restype = None
    # int32_t bevy_hook_set_counting(bevy_hook * hook, int32_t on, int32_t from_layer);
    lib.bevy_hook_set_counting.argtypes = [c_void_p, c_int32, c_int32]
    lib.bevy_hook_set_counting.restype = c_int32
    # int64_t bevy_hook_routed(const bevy_hook * hook, int32_t * out, int64_t max_rows, int32_t * il);
    lib.bevy_hook_routed.argtypes = [c_void_p, POINTER(c_int32), c_int64, POINTER(c_int32)]
    lib.bevy_hook_routed.restype = c_int64
    # int64_t bevy_now_ns(void);
    lib.bevy_now_ns.argtypes = []
    lib.bevy_now_ns.restype = c_int64
    # void bevy_hook_begin(bevy_hook * hook, int64_t token);
    lib.bevy_hook_begin.argtypes = [c_void_p, c_int64]
    lib.bevy_hook_begin.restype = None
    # void bevy_hook_end(bevy_hook * hook);
    lib.bevy_hook_end.argtypes = [c_void_p]
    lib.bevy_hook_end.restype = None
    # int32_t bevy_cache_set_router(bevy_cache * cache, int32_t il, const float * weights, int32_t n_embd);
    lib.bevy_cache_set_router.argtypes = [c_void_p, c_int32, POINTER(ctypes.c_float), c_int32]
    lib.bevy_cache_set_router.restype = c_int32
    # int32_t bevy_hook_set_prefetch(bevy_hook * hook, int32_t enable);
    lib.bevy_hook_set_prefetch.argtypes = [c_void_p, c_int32]
    lib.bevy_hook_set_prefetch.restype = c_int32
    # int64_t bevy_replay(int32_t policy, int32_t n_layer, int32_t n_expert, int64_t n_slots, uint64_t seed,
    #                     const int32_t * layers, const int64_t * offsets, const int32_t * experts, int64_t n_steps);
    lib.bevy_replay.argtypes = [c_int32, c_int32, c_int32, c_int64, c_uint64, POINTER(c_int32), POINTER(c_int64),
                                POINTER(c_int32), c_int64]
    lib.bevy_replay.restype = c_int64
    return lib


def last_error() -> str:
    return (libbevy().bevy_last_error() or b"").decode(errors="replace")


def hook_address(fn: ctypes._CFuncPtr) -> int:
    """The C address of a libbevy function, to pass as a llama_moe_hook_fn."""
    return ctypes.cast(fn, c_void_p).value or 0


def _patched_symbol(llama_cpp: ModuleType, name: str) -> ctypes._CFuncPtr:
    try:
        return getattr(llama_cpp.llama_cpp._lib, name)
    except AttributeError:
        raise BevyError(f"the loaded libllama has no {name}: this needs the patched build") from None


def llama_set_moe_cache(llama_cpp: ModuleType, ctx: int, tensors: ctypes.Array, n_slots: int) -> int:
    """int32_t llama_set_moe_cache(llama_context * ctx, const llama_moe_cache_tensor * tensors,
                                   int32_t n_tensors, int32_t n_slots);"""
    fn = _patched_symbol(llama_cpp, "llama_set_moe_cache")
    fn.argtypes = [c_void_p, POINTER(LlamaMoeCacheTensor), c_int32, c_int32]
    fn.restype = c_int32
    return fn(ctx, tensors, len(tensors), n_slots)


def llama_decode_layers_fn(llama_cpp: ModuleType) -> ctypes._CFuncPtr:
    """int32_t llama_decode_layers(llama_context * ctx, llama_batch batch, int32_t il_begin, int32_t il_end,
                                   bool lookahead, bool reuse);"""
    fn = _patched_symbol(llama_cpp, "llama_decode_layers")
    fn.argtypes = [c_void_p, llama_cpp.llama_batch, c_int32, c_int32, c_bool, c_bool]
    fn.restype = c_int32
    return fn


def llama_moe_set_lazy_experts(llama_cpp: ModuleType, lazy: bool) -> None:
    """void llama_moe_set_lazy_experts(bool lazy);"""
    fn = _patched_symbol(llama_cpp, "llama_moe_set_lazy_experts")
    fn.argtypes = [c_bool]
    fn.restype = None
    fn(lazy)


def llama_set_moe_hook(llama_cpp: ModuleType, ctx: int, fn: int | None, user_data: int | None,
                       want_router_in: bool = False) -> None:
    """void llama_set_moe_hook(llama_context * ctx, llama_moe_hook_fn fn, void * user_data, bool want_router_in);"""
    setter = _patched_symbol(llama_cpp, "llama_set_moe_hook")
    setter.argtypes = [c_void_p, c_void_p, c_void_p, c_bool]
    setter.restype = None
    setter(ctx, fn, user_data, want_router_in)
