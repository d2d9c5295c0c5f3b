"""Replays recorded routing against eviction policies and Belady's optimum.

The access sequence is what `blocking` asks of the cache: every decode step visits the layers
in order, each visit needing the union of the experts the batch selected there. The policies
run libbevy's own code (the live cache's), Belady's optimum evicts the resident expert whose
next use is furthest away (the bound no online policy beats).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from bevy_gguf._native import libbevy as native
from bevy_gguf.errors import BevyError

Visit = tuple[int, list[int]]  # (layer, distinct experts)


def blocking_order(sel: np.ndarray) -> list[Visit]:
    """sel [requests, layers, steps, k] -> the visits of a batched decode, step by step."""
    n_req, n_layer, n_steps, _ = sel.shape
    return [(il, sorted(set(sel[:, il, t].ravel().tolist()))) for t in range(n_steps) for il in range(n_layer)]


def replay_policy(policy: str, visits: list[Visit], n_layer: int, n_expert: int, n_slots: int, seed: int = 0) -> int:
    """Hits of a libbevy policy on visits."""
    layers = (ctypes.c_int32 * len(visits))(*(il for il, _ in visits))
    offsets = np.zeros(len(visits) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(e) for _, e in visits])
    experts = np.array([e for _, es in visits for e in es], dtype=np.int32)
    hits = native.bevy_replay(native.POLICIES[policy], n_layer, n_expert, n_slots, seed, layers,
                           offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                           experts.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(visits))
    if hits < 0:
        raise BevyError(f"replay failed: {native.last_error()}")
    return int(hits)


def fit_visits(visits: list[Visit], n_slots: int) -> list[Visit]:
    """Visits that need more experts than the cache holds split into visits of at most n_slots
    (what the live cache does: a call's tokens are micro-batched so their experts fit)."""
    out: list[Visit] = []
    for il, es in visits:
        out += [(il, list(es[i:i + n_slots])) for i in range(0, len(es), max(1, n_slots))] if es else [(il, es)]
    return out


def belady_hits(visits: list[Visit], n_slots: int, count_from: int = 0) -> int:
    """Hits of Belady's optimal eviction (a visit's own experts are never evicted during it),
    counted from visit `count_from` on (earlier visits only warm the cache)."""
    keys = [[(il, e) for e in es] for il, es in visits]
    # next_use[i][key]: the next visit after i that needs key
    next_use: list[dict[tuple[int, int], int]] = [{} for _ in visits]
    upcoming: dict[tuple[int, int], int] = {}
    for i in range(len(visits) - 1, -1, -1):
        for key in keys[i]:
            next_use[i][key] = upcoming.get(key, 1 << 60)
        for key in keys[i]:
            upcoming[key] = i
    resident: dict[tuple[int, int], int] = {}  # key -> its next use
    hits = 0
    for i, needed in enumerate(keys):
        if len(needed) > n_slots:
            raise BevyError(f"a visit needs {len(needed)} experts, more than {n_slots} slots")
        now = set(needed)
        for key in needed:
            if key in resident:
                hits += i >= count_from
            elif len(resident) >= n_slots:
                victim = max((k for k in resident if k not in now), key=resident.__getitem__)
                del resident[victim]
            resident[key] = next_use[i][key]
    return hits


@dataclass(frozen=True, slots=True)
class ReplayRow:
    policy: str
    n_slots: int
    hits: int
    lookups: int
    bytes_per_token: float

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
