"""Routing of a real run and its statistics (docs/routing.md).

RouterTrace installs libbevy's router-trace hook on a patched context: the hook records the
experts every token selected at every MoE layer and passes the ids through unchanged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from bevy_gguf._native.bevy_handles import RouterTrace as NativeTrace
from bevy_gguf._native.llama_ext import set_moe_hook
from bevy_gguf._native.llama_handles import Context
from bevy_gguf.engine.stats import BatchCall
from bevy_gguf.errors import BevyError

# thresholds, per layer (docs/models.md)
MIN_TOP20_SHARE = 0.50      # the top 20% of experts take at least this share of selections
MIN_CONSECUTIVE = 0.30      # consecutive tokens of a request share at least this part of their experts
MAX_CROSS_JACCARD = 0.50    # hot sets of different requests differ: mean Jaccard at most this


class RouterTrace:
    """The experts each token selected, per layer, recorded by a native hook."""

    def __init__(self, n_layer: int, k: int) -> None:
        self.n_layer, self.k = n_layer, k
        self.native = NativeTrace(n_layer, k)

    def install(self, ctx: Context) -> None:
        set_moe_hook(ctx.lib, ctx.ptr, self.native.fn, self.native.user_data)

    def layer(self, il: int) -> np.ndarray:
        """[rows, k] ids recorded at layer il, in arrival order."""
        return self.native.read(il)

    def close(self) -> None:
        self.native.close()


def per_request(trace: RouterTrace, calls: list[BatchCall], n_requests: int, decode_only: bool = True
                ) -> np.ndarray:
    """[requests, layers, steps, k]: each request's selections, in its token order.

    Rows arrive in batch order (the trace sorts each ubatch's rows back into it), one block per
    decode call; every request must have the same number of steps. The last layer computes only the rows that output
    logits (llama.cpp drops the others before it), so its prefill blocks are shorter. A dense
    layer (no experts, nothing traced) gets -1 for every selection: callers keep moe_layers.
    """
    every = [(i, not call.prefill) for call in calls for i in call.rows]
    outputs = [(call.rows[n], not call.prefill) for call in calls for n in call.output_rows()]
    layers: list[np.ndarray | None] = []
    for il in range(trace.n_layer):
        ids = trace.layer(il)
        if not len(ids) and every:  # a dense layer (no router): -1 below, like no expert
            layers.append(None)
            continue
        owners = every if len(ids) == len(every) else outputs
        if len(owners) != len(ids):
            raise BevyError(f"layer {il}: {len(ids)} rows traced for {len(every)} batch rows")
        rows: list[list[np.ndarray]] = [[] for _ in range(n_requests)]
        for row, (req, is_decode) in zip(ids, owners):
            if is_decode or not decode_only:
                rows[req].append(row)
        layers.append(np.stack([np.stack(r) for r in rows]))
    moe = next(a for a in layers if a is not None)
    return np.stack([np.full_like(moe, -1) if a is None else a for a in layers], axis=1)


@dataclass(frozen=True, slots=True)
class LayerStats:
    layer: int
    top20_share: float       # share of selections taken by the top 20% of experts
    consecutive: float       # mean |E_t ∩ E_t+1| / k over consecutive tokens of a request
    cross_jaccard: float     # mean Jaccard of hot sets (top 25% of experts) of different requests
    lru_hit_1: float         # per-layer LRU of E/4 slots, one request at a time
    lru_hit_all: float       # ... all requests interleaved step by step

    @property
    def ok(self) -> bool:
        return (self.top20_share >= MIN_TOP20_SHARE and self.consecutive >= MIN_CONSECUTIVE
                and self.cross_jaccard <= MAX_CROSS_JACCARD)


def _lru_hits(sequence: list[np.ndarray], slots: int) -> float:
    cache: dict[int, None] = {}
    hits = total = 0
    for experts in sequence:
        for e in experts.tolist():
            total += 1
            if e in cache:
                hits += 1
                cache.pop(e)
            elif len(cache) >= slots:
                cache.pop(next(iter(cache)))
            cache[e] = None
    return hits / total if total else 0.0


def layer_stats(sel: np.ndarray, n_expert: int) -> list[LayerStats]:
    """Statistics of sel [requests, layers, steps, k] for every layer."""
    n_req, n_layer, n_steps, k = sel.shape
    hot_size = max(1, n_expert // 4)
    top_n = max(1, math.ceil(0.2 * n_expert))
    out = []
    for il in range(n_layer):
        s = sel[:, il]
        counts = np.bincount(s.ravel(), minlength=n_expert)
        top20 = np.sort(counts)[::-1][:top_n].sum() / max(counts.sum(), 1)
        overlaps = [len(set(s[r, t]) & set(s[r, t + 1])) / k for r in range(n_req) for t in range(n_steps - 1)]
        hot = [set(np.argsort(-np.bincount(s[r].ravel(), minlength=n_expert), kind="stable")[:hot_size].tolist())
               for r in range(n_req)]
        pairs = [len(a & b) / len(a | b) for a, b in itertools.combinations(hot, 2)]
        lru_1 = float(np.mean([_lru_hits(list(s[r]), hot_size) for r in range(n_req)]))
        lru_all = _lru_hits([s[r, t] for t in range(n_steps) for r in range(n_req)], hot_size)
        out.append(LayerStats(
            layer=il, top20_share=float(top20), consecutive=float(np.mean(overlaps)) if overlaps else 0.0,
            cross_jaccard=float(np.mean(pairs)) if pairs else 0.0, lru_hit_1=lru_1, lru_hit_all=lru_all,
        ))
    return out
