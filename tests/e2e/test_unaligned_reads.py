"""Experts that do not start a page (general.alignment 32, as real files have it) read straight
into slots with a page of room (cache_layout.SlotClass.kind_stride, patch 0010), no bounce copy,
and compute exactly what stock does."""

from __future__ import annotations

from pathlib import Path

from conftest import PROMPTS, compare_by_margin_rule, probe, run_json

from bevy_gguf.engine.cache_layout import PAGE
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ModelSpec, ensure_model

N_TOKENS = 8
# q8_0 experts of 256 x 512: 139,264 bytes, 34 whole pages (enough for a slot to take a page of room)
SPEC = ModelSpec(arch="qwen3moe", dtype="q8_0", layers=2, experts=8, top_k=2, embd=256, ff=512, seed=0)


def texts(doc: dict) -> list[list[int]]:
    return [r["tokens"] for r in doc["requests"]]


def test_experts_inside_pages_load_straight_into_strided_slots(tmp_path: Path) -> None:
    model = ensure_model(SPEC, progress=False)
    info = inspect_model(model)
    assert any(t.offset % PAGE for t in info.expert_tensors)  # the case under test: not page aligned
    layout, _ = ExpertCache.plan_layout(info)
    assert all(c.kind_stride == tuple(b + PAGE for b in c.kind_bytes) for c in layout.classes)
    args = [a for p in PROMPTS for a in ("-p", p)]
    batched = run_json("run", model, "--engine", "stock", "--parallel", "8", "-n", str(N_TOKENS), *args)
    spec = {"prompts": PROMPTS, "max_tokens": N_TOKENS}
    unsplit = probe(model, "blocking", "100%", 8, tmp_path, **spec)
    assert texts(unsplit) == texts(batched)  # every expert through a strided slot, exactly stock's
    for cache in ("100%", "25%"):
        got = probe(model, "blocking", cache, 8, tmp_path, **spec)
        assert got["counters"]["loads"] > 0 and got["pinned_after"] == 0
        if got["link"] == "file (O_DIRECT)":  # elsewhere no bounce copy to avoid
            assert got["counters"]["link_bounced"] == 0, cache
        compared, mismatches = compare_by_margin_rule(batched, got)
        assert mismatches == 0 and compared >= len(PROMPTS) * N_TOKENS // 2, cache


def test_link_reads_bench_counts_the_bounce_copies_each_way() -> None:
    """bench/link_reads.py: a page of room around each expert means no bounce copy; packed
    buffers bounce every expert that does not start a page; page-aligned reads never do."""
    import re
    import subprocess
    import sys

    model = ensure_model(SPEC, progress=False)
    out = subprocess.run([sys.executable, "-m", "bevy_gguf.bench.link_reads", str(model), "--rounds", "1",
                          "--threads", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    copies = {m[1]: int(m[2]) for m in re.finditer(r"^\s*(\S+): .* (\d+) bounce copies", out.stdout, re.M)}
    assert copies["page-aligned"] == copies["room"] == 0
    if "O_DIRECT" in out.stdout.splitlines()[0]:  # every expert of a tensor inside a page bounces (whole pages each)
        unaligned = sum(t.n_expert for t in inspect_model(model).expert_tensors if t.offset % PAGE)
        assert copies["bounce"] == unaligned > 0
