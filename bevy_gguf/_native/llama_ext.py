"""Bindings of the patched libllama's extensions (patches/): the MoE hook, the expert cache's
slots, lazy experts and layer-range decode.

One binding per C function, its prototype in the docstring. The symbols live in the libllama
that llama_cpp loaded (the patched build; bevy_gguf._native.loader chooses it), so each is bound
on first use; on the stock build the first use is one clear error.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_bool, c_char_p, c_int32, c_int64, c_size_t, c_uint64, c_void_p
from functools import cache
from types import ModuleType
from typing import Any

from bevy_gguf.errors import BevyError


class LlamaMoeCacheTensor(ctypes.Structure):
    """llama_moe_cache_tensor: one kind's slots (e.g. "gate" and its bytes) of one layer (il, or -1:
    every layer) for llama_set_moe_cache; n_slots 0: the call's; stride 0: slots packed."""

    _fields_ = [("kind", c_char_p), ("data", c_void_p), ("nbytes", c_size_t), ("il", c_int32), ("n_slots", c_int32),
                ("repack", c_int32), ("slots", c_void_p), ("stride", c_size_t)]


@cache
def _symbol(llama_cpp: ModuleType, name: str, argtypes: tuple[Any, ...], restype: Any) -> Any:
    try:
        fn = getattr(llama_cpp.llama_cpp._lib, name)
    except AttributeError:
        raise BevyError(f"the loaded libllama has no {name}: this needs the patched build") from None
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def set_moe_hook(llama_cpp: ModuleType, ctx: int, fn: int | None, user_data: Any,
                 want_router_in: bool = False) -> None:
    """void llama_set_moe_hook(llama_context * ctx, llama_moe_hook_fn fn, void * user_data, bool want_router_in);

    fn None removes the hook."""
    _symbol(llama_cpp, "llama_set_moe_hook", (c_void_p, c_void_p, c_void_p, c_bool), None)(
        ctx, fn, user_data, want_router_in)


def set_moe_cache(llama_cpp: ModuleType, ctx: int, tensors: ctypes.Array, n_slots: int) -> int:
    """int32_t llama_set_moe_cache(llama_context * ctx, const llama_moe_cache_tensor * tensors,
                                   int32_t n_tensors, int32_t n_slots);

    0, or non-zero when the model's experts do not match the tensors (llama.cpp's log says why)."""
    fn = _symbol(llama_cpp, "llama_set_moe_cache", (c_void_p, POINTER(LlamaMoeCacheTensor), c_int32, c_int32), c_int32)
    return fn(ctx, tensors, len(tensors), n_slots)


def repacks(llama_cpp: ModuleType, ggml_type: int, ne0: int, ne1: int) -> bool:
    """bool llama_moe_repacks(int32_t type, int64_t ne0, int64_t ne1);

    Whether ggml-cpu has a repacked layout (faster kernels, as stock uses) for one such expert."""
    return bool(_symbol(llama_cpp, "llama_moe_repacks", (c_int32, c_int64, c_int64), c_bool)(ggml_type, ne0, ne1))


def _slot_writer(llama_cpp: ModuleType, name: str) -> int:
    """The address of a libbevy slot writer of the patched libllama (bevy_slot_writer_fn's prototype:
    int32_t (int32_t type, int64_t ne0, int64_t ne1, void * dst, const void * src, uint64_t nbytes));
    the upload workers call it, without the GIL."""
    fn = _symbol(llama_cpp, name, (c_int32, c_int64, c_int64, c_void_p, c_void_p, c_uint64), c_int32)
    return ctypes.cast(fn, c_void_p).value


def write_repacked_fn(llama_cpp: ModuleType) -> int:
    """The address of llama_moe_write_repacked: one expert into a slot in ggml-cpu's repacked layout."""
    return _slot_writer(llama_cpp, "llama_moe_write_repacked")


def devices(llama_cpp: ModuleType) -> list[tuple[str, int]]:
    """const char * llama_moe_device_name(int32_t i); int32_t llama_moe_device_type(int32_t i);

    Every ggml device of this build: (name, type), type as enum ggml_backend_dev_type (0: the CPU)."""
    name = _symbol(llama_cpp, "llama_moe_device_name", (c_int32,), c_char_p)
    kind = _symbol(llama_cpp, "llama_moe_device_type", (c_int32,), c_int32)
    found = []
    while (n := name(len(found))) is not None:
        found.append((n.decode(), kind(len(found))))
    return found


def slots_new(llama_cpp: ModuleType, device: str, ggml_type: int, ne0: int, ne1: int, n_slots: int) -> tuple[int, int]:
    """llama_moe_slots * llama_moe_slots_new(const char * device, int32_t type, int64_t ne0, int64_t ne1,
                                             int64_t n_slots, void ** data);

    (the slots' handle, where they start on the device); a BevyError when the device refused them."""
    fn = _symbol(llama_cpp, "llama_moe_slots_new", (c_char_p, c_int32, c_int64, c_int64, c_int64, POINTER(c_void_p)),
                 c_void_p)
    data = c_void_p()
    handle = fn(device.encode(), ggml_type, ne0, ne1, n_slots, ctypes.byref(data))
    if not handle:
        raise BevyError(f"cannot allocate {n_slots} expert slots of {ne0} x {ne1} (ggml type {ggml_type}) on "
                        f"device {device}: lower --expert-cache")
    return handle, data.value


def host_alloc_fns(llama_cpp: ModuleType) -> tuple[int, int]:
    """The addresses of void * llama_moe_host_alloc(void * device, uint64_t nbytes, void ** handle) and
    void llama_moe_host_free(void * handle): a libbevy staging allocator of a device's pinned host
    memory (NULL where the device has none, as the CPU)."""
    alloc = _symbol(llama_cpp, "llama_moe_host_alloc", (c_void_p, c_uint64, POINTER(c_void_p)), c_void_p)
    free = _symbol(llama_cpp, "llama_moe_host_free", (c_void_p,), None)
    return ctypes.cast(alloc, c_void_p).value, ctypes.cast(free, c_void_p).value


def slots_free(llama_cpp: ModuleType, handle: int) -> None:
    """void llama_moe_slots_free(llama_moe_slots * slots);"""
    _symbol(llama_cpp, "llama_moe_slots_free", (c_void_p,), None)(handle)


def write_device_fn(llama_cpp: ModuleType) -> int:
    """The address of llama_moe_write_device: one expert into device slots (ggml_backend_tensor_set,
    complete when it returns)."""
    return _slot_writer(llama_cpp, "llama_moe_write_device")


def set_two_pass(llama_cpp: ModuleType, ctx: int, two_pass: bool) -> None:
    """void llama_moe_set_two_pass(llama_context * ctx, bool two_pass);

    With a cache, each MoE layer computes the experts that are loaded while the others load, then
    those (patch 0004); the logits are those of one pass."""
    _symbol(llama_cpp, "llama_moe_set_two_pass", (c_void_p, c_bool), None)(ctx, two_pass)


def set_lazy_experts(llama_cpp: ModuleType, lazy: bool) -> None:
    """void llama_moe_set_lazy_experts(bool lazy);

    Models loaded from now on leave their routed experts unread (the cache serves them)."""
    _symbol(llama_cpp, "llama_moe_set_lazy_experts", (c_bool,), None)(lazy)


def decode_layers_fn(llama_cpp: ModuleType) -> Any:
    """int32_t llama_decode_layers(llama_context * ctx, llama_batch batch, int32_t il_begin, int32_t il_end,
                                   bool lookahead, bool reuse);

    0, or llama_decode's codes (negative: the graph failed, e.g. its hook did)."""
    return _symbol(llama_cpp, "llama_decode_layers", (c_void_p, llama_cpp.llama_batch, c_int32, c_int32, c_bool,
                                                       c_bool), c_int32)
