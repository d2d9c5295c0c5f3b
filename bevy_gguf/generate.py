"""`bevy-gguf run`: decode requests with an engine and report texts, tokens, margins, speed."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bevy_gguf import native
from bevy_gguf.engine.batched import BatchedRunner, RunStats
from bevy_gguf.engine.expert_cache import ExpertCache, hit_rate
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.schedulers import get_scheduler, make_runner
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.libs import use_libllama
from bevy_gguf.llm import Model
from bevy_gguf.offload import LinkSpec, parse_cache_size
from bevy_gguf.progress import LiveProgress

ENGINES = ("bevy", "stock")


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """What the bevy engine needs beyond the stock one."""

    scheduler: str = "blocking"
    expert_cache: str = "25%"
    link: str = "file"
    eviction: str = "next-use"
    link_workers: int = 4
    wait_timeout_s: float = 300.0


@dataclass(slots=True)
class RunResult:
    engine: str
    n_parallel: int
    requests: list[Request]
    texts: list[str]
    stats: RunStats
    cache: dict[str, Any] | None = None  # the bevy engine's expert cache: size, link, counters

    def to_json(self) -> dict[str, Any]:
        """The §3 `run --json` document (stock fills only tok_per_s)."""
        return {
            "requests": [
                {"prompt": r.prompt, "text": t, "tokens": r.tokens, "margins": [round(m, 6) for m in r.margins]}
                for r, t in zip(self.requests, self.texts)
            ],
            "stats": self._stats_json(),
        }

    def _stats_json(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"tok_per_s": round(self.stats.tok_per_s, 3), "hit_rate": None,
                                 "bytes_loaded": None, "stall_s": None, "link": None}
        if self.cache is not None:
            c = self.cache["decode"]
            stats |= {"hit_rate": round(hit_rate(c), 6), "bytes_loaded": int(c.get("bytes_loaded", 0)),
                      "stall_s": round(c.get("stall_ns", 0) / 1e9, 6), "link": self.cache["link"],
                      "scheduler": self.cache["scheduler"], "expert_cache_bytes": self.cache["bytes"],
                      "expert_cache_slots": self.cache["slots"], "micro_batch": self.cache["micro_batch"],
                      "total": self.cache["total"]}
            if c.get("prefetch_loads"):
                tp, fp, fn = c["prefetch_hits"], c["prefetch_wasted"], c["prefetch_missed"]
                stats |= {"prefetch_precision": round(tp / max(tp + fp, 1), 6),
                          "prefetch_recall": round(tp / max(tp + fn, 1), 6)}
        return stats


def run_stock(model_path: Path, make_requests: Any, n_parallel: int, n_threads: int,
              progress: bool = False) -> RunResult:
    """Decode with unpatched llama.cpp: one context, n_parallel sequences batched per step."""
    inspect_model(model_path)
    llama_cpp = use_libllama("stock")
    with Model(llama_cpp, model_path) as model:
        requests: list[Request] = make_requests(model)
        with LiveProgress(requests) if progress else nullcontext():
            stats = BatchedRunner(model, n_parallel, n_threads).run(requests)
        texts = [model.detokenize(r.tokens) for r in requests]
    return RunResult("stock", n_parallel, requests, texts, stats)


def run_bevy(model_path: Path, make_requests: Any, n_parallel: int, n_threads: int,
             offload: OffloadConfig, progress: bool = False, trace_events: int = 0) -> RunResult:
    """Decode with the patched llama.cpp, routed experts served from a bounded cache."""
    scheduler = get_scheduler(offload.scheduler)
    info = inspect_model(model_path)
    link = LinkSpec.parse(offload.link)
    budget = parse_cache_size(offload.expert_cache, info.expert_bytes)
    llama_cpp = use_libllama("patched")
    native.llama_moe_set_lazy_experts(llama_cpp, True)  # experts are resident only in the cache
    with Model(llama_cpp, model_path) as model, ExpertCache(
            info, budget, link, policy=offload.eviction, n_workers=offload.link_workers,
            wait_timeout_s=offload.wait_timeout_s) as cache:
        requests: list[Request] = make_requests(model)
        limit = max(len(r.prompt_tokens) for r in requests)
        runner, micro_batch = make_runner(scheduler, model, model_path, cache, min(n_parallel, len(requests)),
                                          n_threads, limit)
        cache.trace(trace_events)
        with LiveProgress(requests, cache.counters) if progress else nullcontext():
            stats = runner.run(requests)
        texts = [model.detokenize(r.tokens) for r in requests]
        summary = {"scheduler": offload.scheduler, "link": cache.link_name, "bytes": cache.budget_bytes,
                   "slots": cache.n_slots, "micro_batch": micro_batch, "decode": stats.decode_counters,
                   "total": cache.counters(),
                   "layers": [cache.counters(il) for il in range(info.n_layer)],
                   "events": cache.events() if trace_events else []}
    return RunResult("bevy", n_parallel, requests, texts, stats, cache=summary)
