"""Routing statistics (docs/models.md): the arithmetic, and the recipe on the real engine."""

from __future__ import annotations

import numpy as np
from conftest import run_json

from bevy_gguf.analysis.routing import layer_stats
from bevy_gguf.synth import ensure_model
from bevy_gguf.synth.spec import ModelSpec


def test_stats_of_fixed_routing() -> None:
    sel = np.zeros((2, 1, 4, 2), dtype=np.int32)
    sel[0, 0] = [[0, 1]] * 4          # request 0 always uses experts 0, 1
    sel[1, 0] = [[2, 3], [2, 3], [4, 5], [4, 5]]
    (s,) = layer_stats(sel, n_expert=10)
    assert s.top20_share == 0.5        # top 2 of 10 experts: 8 of 16 selections
    assert np.isclose(s.consecutive, (3 * 1.0 + 1.0 + 0.0 + 1.0) / 6)
    assert s.cross_jaccard == 0.0      # hot sets (top 2): {0,1} vs {2,3}
    assert np.isclose(s.lru_hit_1, (6 / 8 + 4 / 8) / 2)


def test_default_shape_model_meets_design_targets() -> None:
    """The default model's router recipe (ff shrunk: routing does not depend on it)."""
    model = ensure_model(ModelSpec(ff=32), progress=False)
    doc = run_json("trace", model, "--workload", "text")
    assert doc["meets_design_5"], doc["summary"]
    assert len(doc["layers"]) == 8
    # not degenerate either: routing is neither fixed nor uniform
    assert doc["summary"]["lru_hit_all"] < 0.8
    assert all(layer["top20_share"] < 0.9 for layer in doc["layers"])


def test_trace_replays_each_slot_class_through_its_own_slots() -> None:
    """A llama-quantize mix (Q4_K_M: ffn_down Q6_K in some layers, two slot classes): the replay
    table uses the live cache's slots per class, prices each miss at its class's expert bytes,
    and Belady's misses bound every policy's."""
    from conftest import quant_spec

    from bevy_gguf.config import parse_cache_size
    from bevy_gguf.engine.cache_layout import CacheLayout
    from bevy_gguf.gguf_info import inspect_model

    model = ensure_model(quant_spec("Q4_K_M", experts=16), progress=False)
    layout = CacheLayout.of(inspect_model(model))
    assert len(layout.classes) == 2
    doc = run_json("trace", model, "--workload", "text", "--requests", "4", "--steps", "16", "--expert-cache", "50%")
    rows = {r["policy"]: r for r in doc["replay"]}
    assert set(rows) == {"lru", "next-use", "belady"}
    slots = sum(layout.class_slots(parse_cache_size("50%", layout.slot_memory)))  # the live cache's
    assert all(r["slots"] == slots for r in rows.values())
    assert rows["belady"]["hit_rate"] >= max(rows["lru"]["hit_rate"], rows["next-use"]["hit_rate"])
    small, large = sorted(c.bytes for c in layout.classes)
    tokens = 4 * 16
    for r in rows.values():  # each miss costs its own class's expert bytes
        assert r["misses"] > 0 and small <= r["bytes_per_token"] * tokens / r["misses"] <= large
