"""Memory of a bevy-engine run (run in its own process): is any routed expert resident
outside the cache? usage: rss_probe.py MODEL.gguf CACHE_SIZE [--no-lazy]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf._native import llama_ext
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.run_result import run_requests
from bevy_gguf.engine.runners.batched import BatchedRunner
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.workload.prompts import workload_requests


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def mapped_rss_kib(path: Path) -> int:
    """Resident KiB of every mapping of path (/proc/self/smaps)."""
    total, inside = 0, False
    target = str(path.resolve())
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5:
            inside = len(parts) >= 6 and parts[5] == target
        elif inside and parts[0] == "Rss:":
            total += int(parts[1])
    return total


def main() -> int:
    model, size = Path(sys.argv[1]), sys.argv[2]
    llama_cpp = use_libllama("patched")
    baseline = status_kib("VmRSS")
    if "--no-lazy" in sys.argv:  # what the test must catch: experts populated by the loader
        real = llama_ext.set_lazy_experts
        llama_ext.set_lazy_experts = lambda lib, lazy: real(lib, False)
    mapped = {}

    original_run = BatchedRunner.run

    def run_and_measure(self, requests):  # noqa: ANN001, ANN202 - measured while the model is loaded
        stats = original_run(self, requests)
        mapped["kib"] = mapped_rss_kib(model)
        return stats

    BatchedRunner.run = run_and_measure
    config = EngineConfig(model=model, scheduler="blocking", n_parallel=4, n_threads=2, expert_cache=size)
    result = run_requests(config, lambda m: workload_requests(m, 4, 16, 16))
    info = inspect_model(model)
    print(json.dumps({
        "baseline_kib": baseline, "peak_kib": status_kib("VmHWM"), "model_mapped_rss_kib": mapped["kib"],
        "expert_bytes": info.expert_bytes, "file_bytes": info.file_bytes, "cache_bytes": result.cache["bytes"],
        "lib": llama_cpp.__name__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
