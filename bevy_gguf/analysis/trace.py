"""`bevy-gguf trace`: routing statistics of the text workload on a real (patched) run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bevy_gguf._native.llama_handles import Model
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.analysis.replay import ReplayRow, blocking_order
from bevy_gguf.analysis.routing import (
    MAX_CROSS_JACCARD,
    MIN_CONSECUTIVE,
    MIN_TOP20_SHARE,
    LayerStats,
    RouterTrace,
    layer_stats,
    per_request,
)
from bevy_gguf.config import parse_cache_size
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.runners.batched import BatchedRunner
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.workload.prompts import workload_requests


def trace_workload(model_path: Path, n_requests: int, prompt_tokens: int, steps: int,
                   n_threads: int = 2, with_prefill: bool = False) -> tuple[np.ndarray, int] | tuple:
    """Decode n_requests workload texts together (teacher forced); returns
    ([requests, layers, steps, k] selections over the decode steps, n_expert), and with
    with_prefill also each layer's distinct experts during the prefill (what warms a cache)."""
    info = inspect_model(model_path)
    llama_cpp = use_libllama("patched")
    with Model(llama_cpp, model_path) as model:
        requests = workload_requests(model, n_requests, prompt_tokens, steps)
        trace = RouterTrace(model.n_layer, info.n_expert_used)
        try:
            stats = BatchedRunner(model, n_requests, n_threads, on_context=trace.install).run(requests)
            sel = per_request(trace, stats.calls, len(requests))
            n_prefill = sum(len(c.rows) for c in stats.calls if c.prefill)
            n_prefill_out = sum(len(c.output_rows()) for c in stats.calls if c.prefill)
            prefill = []
            for il in info.moe_layers:
                rows = trace.layer(il)
                first = n_prefill if len(rows) == n_prefill + steps * n_requests else n_prefill_out
                prefill.append((il, sorted(set(rows[:first].ravel().tolist()))))
        finally:
            trace.close()
    if with_prefill:
        return sel[:, info.moe_layers], info.n_expert, prefill
    return sel[:, info.moe_layers], info.n_expert


def summarize(stats: list[LayerStats]) -> dict[str, float]:
    return {
        "top20_share_min": min(s.top20_share for s in stats),
        "consecutive_min": min(s.consecutive for s in stats),
        "cross_jaccard_max": max(s.cross_jaccard for s in stats),
        "lru_hit_1": float(np.mean([s.lru_hit_1 for s in stats])),
        "lru_hit_all": float(np.mean([s.lru_hit_all for s in stats])),
    }


def replays(model_path: Path, sel: np.ndarray, n_expert: int, cache_sizes: list[str]) -> list[ReplayRow]:
    """lru, next-use and Belady on the blocking order of sel through the live cache's slots: in
    slot classes (a llama-quantize mix has several), each class replayed on its own layers' visits
    with its own slots, its misses priced at its own expert bytes (as the bench's bound counts them)."""
    from bevy_gguf.bench.harness import belady_misses, class_misses, policy_misses

    info = inspect_model(model_path)
    layout = CacheLayout.of(info)
    moe = layout.moe_layers  # sel's layers are the MoE layers, in order
    order = {"prefill": [], "decode": [(moe[il], es) for il, es in blocking_order(sel)]}
    lookups = sum(len(e) for _, e in order["decode"])
    tokens = sel.shape[0] * sel.shape[2]
    rows = []
    for size in cache_sizes:
        budget = parse_cache_size(size, layout.slot_memory)
        slots = layout.class_slots(budget)
        if min(slots) < layout.min_slots(1):
            raise BevyError(f"--expert-cache {size} holds {min(slots)} experts of a slot class, below one token's "
                            f"{layout.min_slots(1)}: raise it")
        for policy in ("lru", "next-use", "belady"):
            count = belady_misses if policy == "belady" else (
                lambda o, n, p=policy: policy_misses(o, n, p, info.n_layer, info.n_expert))
            misses, nbytes = class_misses(order, layout, budget, count)
            rows.append(ReplayRow(policy, sum(slots), lookups - misses, lookups, nbytes / tokens))
    return rows


def run_trace(model_path: Path, n_requests: int, prompt_tokens: int, steps: int, n_threads: int,
              as_json: bool, cache_sizes: list[str] | None = None) -> int:
    sel, n_expert = trace_workload(model_path, n_requests, prompt_tokens, steps, n_threads)
    stats = layer_stats(sel, n_expert)
    summary = summarize(stats)
    ok = all(s.ok for s in stats)
    rows = replays(model_path, sel, n_expert, cache_sizes) if cache_sizes else []
    if as_json:
        print(json.dumps({"workload": "text", "requests": n_requests, "steps": steps,
                          "layers": [{f: getattr(s, f) for f in s.__slots__} for s in stats],
                          "summary": summary, "meets_design_5": ok,
                          "replay": [{"policy": r.policy, "slots": r.n_slots, "hit_rate": r.hit_rate,
                                      "misses": r.lookups - r.hits, "bytes_per_token": r.bytes_per_token}
                                     for r in rows]}))
        return 0
    k = sel.shape[-1]
    print(f"routing of the text workload: {n_requests} requests x {steps} decode steps (teacher forced), "
          f"{n_expert} experts, top-{k}")
    print(f"targets (docs/models.md, every layer): top-20% share >= {MIN_TOP20_SHARE:.2f}, consecutive overlap "
          f">= {MIN_CONSECUTIVE:.2f}, cross-request hot-set Jaccard <= {MAX_CROSS_JACCARD:.2f}")
    print(f"{'layer':>5} {'top20%':>7} {'consec':>7} {'jaccard':>8} {'lru1':>6} {'lru-all':>8}")
    for s in stats:
        print(f"{s.layer:>5} {s.top20_share:>7.2f} {s.consecutive:>7.2f} {s.cross_jaccard:>8.2f} "
              f"{s.lru_hit_1:>6.2f} {s.lru_hit_all:>8.2f}{'' if s.ok else '  <- misses a target'}")
    print(f"LRU hit rates use E/4 = {max(1, n_expert // 4)} slots per layer. "
          f"{'All layers meet' if ok else 'Some layers miss'} the routing targets.")
    if rows:
        print("replay of the blocking order (decode steps, every layer's union) through the cache's slots "
              "(each slot class on its own layers):")
        print(f"{'slots':>6} {'policy':>9} {'hit rate':>9} {'MB/token':>9}")
        for r in rows:
            print(f"{r.n_slots:>6} {r.policy:>9} {r.hit_rate:>9.3f} {r.bytes_per_token / 1e6:>9.3f}")
    return 0
