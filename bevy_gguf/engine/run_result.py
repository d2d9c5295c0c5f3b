"""One fixed batch of requests through an engine, and what `run --json` and the bench report of it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from bevy_gguf._native.llama_handles import Model
from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import RUNNER_STATS, LLMEngine
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.stats import RunStats, hit_rate


@dataclass(slots=True)
class RunResult:
    config: EngineConfig
    requests: list[Request]
    texts: list[str]
    stats: RunStats
    cache: dict[str, Any] | None = None  # the bevy engine's expert cache: size, link, counters

    def to_json(self) -> dict[str, Any]:
        """The `run --json` document (docs/cli.md; the stock engine fills only tok_per_s)."""
        return {
            "requests": [
                {"prompt": r.prompt, "text": t, "tokens": r.tokens, "margins": [round(m, 6) for m in r.margins]}
                | ({"error": r.error} if r.error else {})
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
                      "scheduler": self.cache["scheduler"], "scheduler_note": self.cache["scheduler_note"],
                      "expert_cache_bytes": self.cache["bytes"], "expert_store": self.cache["store"],
                      "pinned_staging_buffers": self.cache["staging_pinned"],
                      "expert_cache_slots": self.cache["slots"], "micro_batch": self.cache["micro_batch"],
                      "slot_classes": self.cache["class_slots"],
                      "expert_cache_wasted_bytes": self.cache["wasted_bytes"],
                      # start-up seconds loading every expert, where the cache holds them all (else 0)
                      "expert_cache_fill_s": round(self.cache["fill_s"], 6),
                      # expert tensors whose slots are in ggml-cpu's repacked layout (as stock repacks them)
                      "repacked_expert_tensors": f"{self.cache['repacked']} of {self.cache['expert_tensors']}",
                      "total": self.cache["total"], "link_load_s": self.cache["load_s"],
                      "cost_model": self.cache["cost_model"], "lane_seconds": self.cache["lane_seconds"]}
            stats |= {key: self.cache[key] for key in RUNNER_STATS}
            if c.get("prefetch_loads"):
                tp, fp, fn = c["prefetch_hits"], c["prefetch_wasted"], c["prefetch_missed"]
                stats |= {"prefetch_precision": round(tp / max(tp + fp, 1), 6),
                          "prefetch_recall": round(tp / max(tp + fn, 1), 6)}
        return stats


def run_requests(config: EngineConfig, make_requests: Callable[[Model], list[Request]],
                 progress: Callable[[list[Request], Callable[[], dict[str, int]] | None], Any] | None = None,
                 trace_events: int = 0) -> RunResult:
    """Open config's engine, decode the requests make_requests builds on its model, close it.
    progress(requests, counters) is a context manager shown while they decode."""
    with LLMEngine(config) as engine:
        requests = make_requests(engine.model)
        if engine.cache is not None:
            engine.cache.trace(trace_events)
        counters = engine.cache.counters if engine.cache is not None else None
        with progress(requests, counters) if progress else nullcontext():
            stats = engine.generate(requests)
        texts = [engine.model.detokenize(r.tokens) for r in requests]
        return RunResult(config, requests, texts, stats, engine.cache_summary(stats, events=trace_events > 0))
