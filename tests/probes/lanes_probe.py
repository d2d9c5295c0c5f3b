"""The lane measurement's call length on a cache that cannot hold every layer's worst case; prints JSON.

usage: lanes_probe.py MODEL CACHE N_SEQ
On a cold cache: the layers the worst case allows (calibrate.calibration_layers), the layers the
calibration's own tokens fit (calibrate.resident_layers), then choose_lanes with the loads its timed
calls made (none, if what resident_layers counted stays in), and resident_layers again on the now
warm cache (the count must not depend on what is already in).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import ContextParams, Model
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.config import LinkSpec, parse_cache_size
from bevy_gguf.engine import calibrate
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model


def main() -> None:
    path, size, n_seq = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    lib = use_libllama("patched")
    llama_ext.set_lazy_experts(lib, True)
    info = inspect_model(path)
    out: dict = {"n_layer": info.n_layer}
    with Model(lib, path) as model, ExpertCache(info, parse_cache_size(size, info.expert_bytes),
                                                 LinkSpec("ram"), wait_timeout_s=60, lib=lib) as cache:
        params = ContextParams(n_ctx=n_seq * 64, n_batch=64, n_seq_max=n_seq, n_threads=2)
        with cache.not_learning():
            out["worst_case"] = calibrate.calibration_layers(cache, n_seq)
            out["resident"] = calibrate.resident_layers(model, cache, params)
            loads = cache.counters()["loads"]
            out["lanes"], seconds, out["timed_layers"] = calibrate.choose_lanes(model, cache, params, [1, 2])
            out["timing_loads"] = cache.counters()["loads"] - loads
            out["seconds"] = {str(k): v for k, v in seconds.items()}
            out["resident_warm"] = calibrate.resident_layers(model, cache, params)
        out["pinned_after"] = cache.pinned()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
