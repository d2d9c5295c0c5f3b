"""Expert slots in a ggml device's memory (`--device NAME`): the GPU tier's cache.

By default the slots are host memory that libbevy allocates and its upload workers read into.
With a device, each (slot class, kind) is one buffer of that device (patch 0008,
`llama_moe_slots_new`: the device's buffer type, usage WEIGHTS, so ggml's scheduler runs the
expert matmuls there), libbevy allocates nothing (`external_slots`), and a worker reads an expert
into its staging buffer, then copies it in with `llama_moe_write_device` (ggml_backend_tensor_set:
on CUDA a copy on the worker's own stream, complete when it returns, so a slot is Ready only
after its copy). ggml's own CPU device takes the same path, which is how it is tested here.
"""

from __future__ import annotations

import ctypes
from types import ModuleType

import gguf

from bevy_gguf._native import llama_ext
from bevy_gguf._native.bevy_handles import NativeCache
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import ModelInfo

CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


def find_device(devices: list[tuple[str, int]], name: str, gpu_layers: int) -> tuple[str, int]:
    """The ggml device called `name` (case as ggml ignores it) and its type, or one line that says
    what this build has. One cache lives on one device: with layers offloaded (gpu_layers > 0)
    and several GPUs, llama.cpp would spread the layers over all of them, so that is refused."""
    found = [d for d in devices if d[0].lower() == name.lower()]
    if not found:
        have = ", ".join(n for n, _ in devices) or "none"
        raise BevyError(f"--device {name}: this build has no such ggml device (it has: {have}); choose one of "
                        "them (a CUDA device needs `make build CUDA=1`)")
    gpus = [n for n, kind in devices if kind != CPU_DEVICE]
    if gpu_layers > 0 and len(gpus) > 1:
        raise BevyError(f"--gpu-layers {gpu_layers} would spread the model's layers over {len(gpus)} devices "
                        f"({', '.join(gpus)}) and the expert cache lives on one: make only {found[0][0]} visible "
                        "(e.g. CUDA_VISIBLE_DEVICES)")
    return found[0]


class DeviceSlots:
    """The device buffers of one expert cache, per (slot class, kind), handed to libbevy."""

    def __init__(self, llama_cpp: ModuleType, device: str, info: ModelInfo, layout: CacheLayout,
                 class_slots: list[int], native: NativeCache) -> None:
        self.lib = llama_cpp
        self.device = device
        self._handles: dict[tuple[int, int], tuple[int, int]] = {}  # (class, kind) -> (handle, data)
        shapes = {(t.layer, t.kind): (gguf.GGMLQuantizationType[t.ggml_type].value, *t.ne) for t in info.expert_tensors}
        try:
            for c, sc in enumerate(layout.classes):
                for k, kind in enumerate(layout.kinds):
                    ggml_type, ne0, ne1 = shapes[(sc.layers[0], kind)]
                    handle, data = llama_ext.slots_new(llama_cpp, device, ggml_type, ne0, ne1, class_slots[c])
                    self._handles[(c, k)] = (handle, data)
                    native.set_slot_data(k, c, data)
        except BaseException:
            self.free()
            raise
        writer = llama_ext.write_device_fn(llama_cpp)
        for (il, kind), shape in shapes.items():
            native.set_writer(il, layout.kinds.index(kind), writer, *shape)
        # the workers read experts into the device's pinned host memory, which it copies from at full
        # speed (a copy from pageable memory goes through the driver's own bounce); none on the CPU
        self._device_name = ctypes.create_string_buffer(device.encode())  # alive while the workers run
        native.set_staging(*llama_ext.host_alloc_fns(llama_cpp), ctypes.addressof(self._device_name))

    def slots(self, slot_class: int, kind: int) -> tuple[int, int]:
        """(the handle for llama_moe_cache_tensor.slots, where they start)."""
        try:
            return self._handles[(slot_class, kind)]
        except KeyError:
            raise BevyError(f"no device slots of class {slot_class}, kind {kind}") from None

    def free(self) -> None:
        """Give the buffers back (after the cache's workers and every context are gone)."""
        for handle, _ in self._handles.values():
            llama_ext.slots_free(self.lib, handle)
        self._handles.clear()
