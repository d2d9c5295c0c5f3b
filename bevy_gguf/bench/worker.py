"""One benchmark run in its own process: a system at a cache point; prints one JSON object.

usage: python -m bevy_gguf.bench.worker '<spec json>'
Every run starts cold (a fresh process, an empty expert cache); stock runs load the stock
libllama, the others the patched one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bevy_gguf.bench.window import (
    CounterSampler,
    steady_window,
    window_counters,
    window_outputs,
    window_ttft_by_request,
)
from bevy_gguf.config import DEFAULT_RUNAHEAD, EngineConfig
from bevy_gguf.engine.engine import RUNNER_STATS
from bevy_gguf.engine.registry import scheduler_names
from bevy_gguf.engine.run_result import RunResult, run_requests
from bevy_gguf.errors import BevyError
from bevy_gguf.workload.prompts import workload_requests
from bevy_gguf.workload.serving import ServeShape, serving_requests

STOCK_SYSTEMS = ("stock-resident", "stock-offload")
BEVY_SYSTEMS = tuple(reversed(scheduler_names()))  # blocking, prefetch, bevy-ctx, bevy
SYSTEMS = STOCK_SYSTEMS + BEVY_SYSTEMS


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def inter_token_ms(result: RunResult) -> list[float]:
    """Time between consecutive outputs of each request (decode steps only)."""
    return [1e3 * (b - a) for r in result.requests for a, b in zip(r.times, r.times[1:])]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    system = spec["system"]
    model = Path(spec["model"])
    workload = spec.get("workload", "text")
    serve = workload == "serve"

    def make_requests(m):  # noqa: ANN001, ANN202
        if serve:
            shape = ServeShape(requests=spec["requests"], prompt_tokens=tuple(spec["prompt_range"]),
                               decode_tokens=tuple(spec["decode_range"]), seed=spec.get("seed", 0))
            return serving_requests(m, shape)
        return workload_requests(m, spec["requests"], spec["prompt_tokens"], spec["steps"], seed=spec.get("seed", 0),
                                 forced=workload == "text")

    samplers: list[CounterSampler] = []

    def sample_counters(_requests, counters):  # noqa: ANN001, ANN202
        samplers.append(CounterSampler(counters or dict))
        return samplers[-1]

    if system not in SYSTEMS:
        raise BevyError(f"unknown system {system!r}: choose from {', '.join(SYSTEMS)}")
    stock = system in STOCK_SYSTEMS
    config = EngineConfig(model=model, engine="stock" if stock else "bevy",
                          scheduler="blocking" if stock else system, n_parallel=spec["parallel"],
                          n_threads=spec["threads"], expert_cache=spec.get("cache", "100%"),
                          link=spec.get("link", "file"), eviction=spec.get("eviction", "next-use"),
                          split_factor=spec.get("split_factor", 1.0), load_budget=spec.get("load_budget", 1.0),
                          lanes=spec.get("lanes", 0),
                          **({"link_workers": spec["link_workers"]} if "link_workers" in spec else {}),
                          two_pass=spec.get("two_pass", "auto"),
                          runahead=spec.get("runahead", DEFAULT_RUNAHEAD), prefill_wave=spec.get("prefill_wave", 16),
                          prefill_first=spec.get("prefill_first", "auto"),
                          kv_unified=spec.get("kv_unified", "off") == "on",
                          wide_prefill=spec.get("wide_prefill", "off") == "on",
                          lane_clock=spec.get("lane_clock", "relative"),
                          resident_steps=spec.get("resident_steps", "rare-misses"),
                          repack=spec.get("repack", True), device=spec.get("device"),
                          gpu_layers=spec.get("gpu_layers", 0), n_cpu_moe=spec.get("n_cpu_moe", 0))
    result = run_requests(config, make_requests, progress=sample_counters if serve else None,
                          trace_events=0 if stock else spec.get("trace_events", 0))
    s = result.stats
    out: dict[str, Any] = {
        "system": system, "decode_tokens": s.decode_tokens, "decode_s": s.decode_s, "prefill_s": s.prefill_s,
        "tok_per_s": s.tok_per_s, "tpot_ms": inter_token_ms(result),
        "ttft_ms": [1e3 * r.ttft_s for r in result.requests if r.ttft_s is not None],
        "ttft_by_request": {str(i): 1e3 * r.ttft_s for i, r in enumerate(result.requests) if r.ttft_s is not None},
        "peak_rss_bytes": peak_rss_bytes(), "errors": [r.error for r in result.requests if r.error],
        "request_times": [r.times for r in result.requests],
    }
    if result.cache is not None:
        d = result.cache["decode"]
        out |= {"cache_bytes": result.cache["bytes"], "link": result.cache["link"], "decode_counters": d,
                "micro_batch": result.cache["micro_batch"], "events": result.cache["events"],
                "load_s": result.cache["load_s"], "cost_model": result.cache["cost_model"],
                "lane_seconds": result.cache["lane_seconds"], "compute_busy_s": d.get("compute_busy_ns", 0) / 1e9,
                "compute_used_s": d.get("compute_used_ns", 0) / 1e9,
                "link_busy_s": d.get("link_busy_ns", 0) / 1e9,
                "repacked_expert_tensors": (result.cache["repacked"], result.cache["expert_tensors"]),
                "expert_store": result.cache["store"]}
        out |= {key: result.cache[key] for key in RUNNER_STATS}
    else:
        out |= {"compute_busy_s": s.decode_s, "link_busy_s": 0.0}
    if serve:
        out |= in_window(result, spec["parallel"], spec.get("warmup") or spec["parallel"], samplers[0], stock)
    return out


def in_window(result: RunResult, n_parallel: int, warmup: int, sampler: CounterSampler, stock: bool
              ) -> dict[str, Any]:
    """A serving run's figures inside its steady-state window (bench/window.py), in place of the
    whole run's (kept under "whole_run"): decode tokens, tok/s, TPOT, TTFT, counters, busy times."""
    requests = result.requests
    window = steady_window([r.times[-1] for r in requests if r.times], n_parallel, warmup)
    tokens, gaps = window_outputs([r.times for r in requests], window)
    out: dict[str, Any] = {
        "whole_run": {"decode_tokens": result.stats.decode_tokens, "decode_s": result.stats.decode_s,
                      "tok_per_s": result.stats.tok_per_s},
        "window": {"start_s": window.start - sampler.times[0], "seconds": window.seconds,
                   "requests": len(requests), "warmup": warmup},
        "decode_tokens": tokens, "decode_s": window.seconds, "tok_per_s": tokens / window.seconds, "tpot_ms": gaps,
    }
    ttft = window_ttft_by_request([r.admitted_s for r in requests], [r.times[0] if r.times else None
                                                                     for r in requests], window)
    out |= {"ttft_ms": list(ttft.values()), "ttft_by_request": {str(i): ms for i, ms in ttft.items()}}
    if stock:
        return out | {"compute_busy_s": window.seconds}
    return out | window_counters(sampler, window)


def main(run_spec: Callable[[dict[str, Any]], dict[str, Any]] = run) -> int:
    """Run the spec of argv[1]; print its JSON (a BevyError as an error row). bench/served.py's too."""
    spec = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    try:
        out = run_spec(spec)
    except BevyError as e:
        print(json.dumps({"system": spec.get("system"), "error": str(e)}))
        return 0
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
