"""Thin ctypes bindings: libbevy (native/include/bevy.h) and the patched libllama's hook setter.

One binding per C function, its prototype above it; no logic here.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_bool, c_int32, c_int64, c_void_p
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
    ]


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
    return lib


def hook_address(fn: ctypes._CFuncPtr) -> int:
    """The C address of a libbevy function, to pass as a llama_moe_hook_fn."""
    return ctypes.cast(fn, c_void_p).value or 0


def llama_set_moe_hook(llama_cpp: ModuleType, ctx: int, fn: int | None, user_data: int | None,
                       want_router_in: bool = False) -> None:
    """void llama_set_moe_hook(llama_context * ctx, llama_moe_hook_fn fn, void * user_data, bool want_router_in);"""
    lib = llama_cpp.llama_cpp._lib
    try:
        setter = lib.llama_set_moe_hook
    except AttributeError:
        raise BevyError("the loaded libllama has no llama_set_moe_hook: this needs the patched build") from None
    setter.argtypes = [c_void_p, c_void_p, c_void_p, c_bool]
    setter.restype = None
    setter(ctx, fn, user_data, want_router_in)
