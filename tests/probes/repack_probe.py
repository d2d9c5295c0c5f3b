"""Loads one expert of every kind of layer 0 through an expert cache with repacked slots and
prints, as JSON, what the tests check: which expert tensors llama.cpp repacks on this CPU, how
many the cache repacks, and whether each loaded slot holds llama_moe_write_repacked's layout of
the file's bytes (and not the file's bytes).

usage: repack_probe.py MODEL
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from pathlib import Path

import gguf

from bevy_gguf._native import libbevy, llama_ext
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model

# libbevy's bevy_slot_writer_fn (llama_moe_write_repacked's signature)
WRITER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_uint64)


def load_expert_0(cache: ExpertCache, timeout_s: float = 10.0) -> bool:
    """Admit a flight of layer 0 needing expert 0 until it is resident; False at the timeout."""
    flights = cache.flights()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flights.fill([0], [(0,)], [0], [True], [False])
        if libbevy.bevy_cache_refresh(cache.native.handle, 0, flights.pointer(), flights.n, None) != 0:
            raise RuntimeError(libbevy.last_error())
        if flights.absent() == [0]:
            return True
        time.sleep(0.01)
    return False


if __name__ == "__main__":
    llama_cpp = use_libllama("patched")
    info = inspect_model(Path(sys.argv[1]))
    type_id = {t.name: gguf.GGMLQuantizationType[t.ggml_type].value for t in info.expert_tensors}
    here = [t.name for t in info.expert_tensors if llama_ext.repacks(llama_cpp, type_id[t.name], *t.ne)]
    write = WRITER(llama_ext.write_repacked_fn(llama_cpp))
    layout = CacheLayout.of(info)
    data = Path(info.path).read_bytes()
    slots = []
    with ExpertCache(info, 4 * layout.slot_bytes, LinkSpec.parse("ram"), repack=llama_cpp) as cache:
        if not load_expert_0(cache):
            raise SystemExit("expert 0 of layer 0 never loaded")
        for t in info.expert_tensors:
            if t.layer != 0:
                continue
            kind = layout.kinds.index(t.kind)
            nbytes = layout.layer_kind_bytes(0)[kind]
            raw = data[t.offset:t.offset + nbytes]
            want = ctypes.create_string_buffer(nbytes)
            rc = write(type_id[t.name], *t.ne, ctypes.addressof(want), raw, nbytes)
            base = cache.native.slot_data(kind, layout.layer_class[0])
            held = [ctypes.string_at(base + s * nbytes, nbytes) for s in range(cache.class_slots[0])]
            slots.append({"name": t.name, "write_rc": rc, "holds_repacked": rc == 0 and want.raw in held,
                          "holds_file_bytes": raw in held, "layout_differs": want.raw != raw,
                          "bad_size_rc": write(type_id[t.name], *t.ne, ctypes.addressof(want), raw, nbytes - 1)})
        repacked = list(cache.repacked)
    print(json.dumps({"repacks_here": here, "repacked": repacked, "layer0": slots}))
