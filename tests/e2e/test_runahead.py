"""Runahead (`bevy-ctx`) and `prefetch` against stock llama.cpp by docs/correctness.md; liveness; fairness."""

from __future__ import annotations

import ctypes
import json
import random
import threading
import time
from pathlib import Path

import pytest
from conftest import PROMPTS, compare_by_margin_rule, probe, run_cli, run_json, stock_alone, tiny_spec

from bevy_gguf._native import libbevy as native
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model
from bevy_gguf.synth.spec import ARCHS


@pytest.mark.parametrize("cache", ["100%", "25%"])
def test_bevy_ctx_equals_stock_one_at_a_time(tmp_path: Path, runahead_model: Path, cache: str) -> None:
    ref = stock_alone(runahead_model, PROMPTS, 12)
    got = probe(runahead_model, "bevy-ctx", cache, 8, tmp_path, prompts=PROMPTS, max_tokens=12)
    assert [r["tokens"] for r in got["requests"]] == [r["tokens"] for r in ref["requests"]]
    assert got["pinned_after"] == 0
    if cache == "25%":
        assert got["micro_batch"] == 1 and got["counters"]["evictions"] > 0


@pytest.mark.parametrize("cache", ["100%", "25%"])
def test_prefetch_equals_blocking(tmp_path: Path, runahead_model: Path, cache: str) -> None:
    blocking = probe(runahead_model, "blocking", cache, 8, tmp_path, prompts=PROMPTS, max_tokens=12)
    prefetch = probe(runahead_model, "prefetch", cache, 8, tmp_path, prompts=PROMPTS, max_tokens=12)
    assert [r["tokens"] for r in prefetch["requests"]] == [r["tokens"] for r in blocking["requests"]]
    c = prefetch["counters"]
    if cache == "100%":  # every expert loaded at start-up (ExpertCache.fill): nothing misses, nothing to predict
        assert c["misses"] == 0 and c["prefetch_loads"] == 0 and c["loads"] == blocking["counters"]["loads"] > 0
        return
    assert c["prefetch_loads"] > 0 and c["prefetch_hits"] > 0
    assert c["prefetch_hits"] + c["prefetch_missed"] > 0


def test_prefetch_reports_precision_and_recall(runahead_model: Path) -> None:
    doc = run_json("run", runahead_model, "--scheduler", "prefetch", "--expert-cache", "50%", "--workload", "text",
                   "--requests", "4", "-n", "8")
    p, r = doc["stats"]["prefetch_precision"], doc["stats"]["prefetch_recall"]
    assert 0 < p <= 1 and 0 < r <= 1


@pytest.mark.parametrize("seed", range(3))
def test_liveness_randomized(tmp_path: Path, seed: int) -> None:
    """16 requests, the minimum cache, random eviction, early stops, one thread or two (bevy:
    one lane or two): every request finishes."""
    rng = random.Random(seed)
    model = ensure_model(tiny_spec(ARCHS[seed % 3], layers=4, experts=16, top_k=2), progress=False)
    prompts = ["".join(rng.choice("abcxyz 0123,.äß") for _ in range(rng.randint(1, 24))) for _ in range(16)]
    stop = [rng.choice("abcxyz0123")]
    for scheduler in ("bevy", "bevy-ctx", "blocking", "prefetch"):
        got = probe(model, scheduler, "25%", 8, tmp_path, prompts=prompts, max_tokens=rng.randint(2, 10),
                    stop=stop, eviction="random", seed=seed, threads=1 + seed % 2)
        assert all(r["finish"] in ("length", "stop") and r["error"] is None for r in got["requests"]), scheduler
        assert got["pinned_after"] == 0


def test_a_failing_request_fails_alone(tmp_path: Path) -> None:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    ref = stock_alone(model, PROMPTS[:6], 8)
    got = probe(model, "bevy-ctx", "50%", 4, tmp_path, prompts=PROMPTS[:6], max_tokens=8, bad=[2])
    bad = got["requests"][2]
    assert bad["finish"] == "error" and "llama_decode failed" in bad["error"]
    for i, (r, g) in enumerate(zip(ref["requests"], got["requests"])):
        if i != 2:
            assert g["error"] is None and g["tokens"] == r["tokens"]
    assert got["pinned_after"] == 0  # nothing the failed graph pinned stays pinned


def test_lagging_context_is_admitted_first(tmp_path: Path) -> None:
    """With one compute slot held, a context behind (token 2) enters before one ahead (token 5)."""
    lib = native.libbevy()
    blob = tmp_path / "blob"
    blob.write_bytes(b"\0" * 4096)
    link = lib.bevy_link_file_new(str(blob).encode())
    params = lib.bevy_cache_default_params()
    params.n_layer, params.n_expert, params.n_kinds, params.n_slots = 1, 2, 1, 2
    params.kind_bytes[0] = 16
    cache = lib.bevy_cache_new(ctypes.byref(params), link)
    lib.bevy_cache_set_concurrency(cache, 1)
    hooks = [lib.bevy_hook_new(cache) for _ in range(3)]
    for h in hooks:
        lib.bevy_hook_set_gated(h, 1)
    order: list[int] = []
    lib.bevy_hook_begin(hooks[0], 9, 0)  # holds the only slot

    def enter(n: int, token: int) -> None:
        lib.bevy_hook_begin(hooks[n], token, 0)
        order.append(token)
        lib.bevy_hook_end(hooks[n], None)

    ahead = threading.Thread(target=enter, args=(1, 5))
    ahead.start()
    time.sleep(0.2)
    behind = threading.Thread(target=enter, args=(2, 2))
    behind.start()
    time.sleep(0.2)
    assert order == []
    lib.bevy_hook_end(hooks[0], None)
    ahead.join(5)
    behind.join(5)
    assert order == [2, 5]
    counters = native.BevyCounters()
    lib.bevy_cache_counters(cache, -1, ctypes.byref(counters))
    assert counters.compute_busy_ns >= 0.35e9  # the slot was held from the start to the end
    for h in hooks:
        lib.bevy_hook_free(h)
    lib.bevy_cache_free(cache)
    lib.bevy_link_free(link)


def test_runahead_below_its_minimum_is_refused(runahead_model: Path) -> None:
    from conftest import run_cli

    proc = run_cli("run", runahead_model, "--workload", "text", "--requests", "8", "--parallel", "8",
                   "--scheduler", "bevy-ctx", "--expert-cache", "20%", check=False)
    need = CacheLayout.of(inspect_model(runahead_model)).min_slots(1, 8)
    assert proc.returncode != 0 and f"8 contexts need at least {need}" in proc.stderr


def test_margin_rule_holds_for_workload_requests(runahead_model: Path) -> None:
    ref = run_json("run", runahead_model, "--engine", "stock", "--parallel", "1", "--workload", "text",
                   "--requests", "8", "-n", "16")
    got = run_json("run", runahead_model, "--scheduler", "bevy-ctx", "--expert-cache", "25%", "--workload", "text",
                   "--requests", "8", "-n", "16")
    compared, mismatches = compare_by_margin_rule(ref, got)
    assert mismatches == 0 and compared >= 8 * 16 // 2


def test_bevy_on_an_arch_without_layer_range_decode_runs_bevy_ctx_and_says_so(tmp_path: Path) -> None:
    """A builder that patch 0003 does not cover would abort on a partial range: bevy runs
    bevy-ctx there, with one line on stderr, the answers bevy-ctx's (= stock --parallel 1)."""
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)  # qwen3moe, as if not covered
    ref = stock_alone(model, PROMPTS[:4], 8)
    got = probe(model, "bevy", "25%", 4, tmp_path, prompts=PROMPTS[:4], max_tokens=8,
                layer_range_archs=["qwen2moe", "llama"])
    assert got["scheduler"] == "bevy-ctx" and "qwen3moe builder does not have" in got["scheduler_note"]
    assert [r["tokens"] for r in got["requests"]] == [r["tokens"] for r in ref["requests"]]
    covered = probe(model, "bevy", "25%", 4, tmp_path, prompts=PROMPTS[:4], max_tokens=8)
    assert covered["scheduler"] == "bevy" and covered["scheduler_note"] is None


def test_bevy_on_qwen35moe_runs_itself() -> None:
    """qwen35moe (Qwen3.5/3.6-MoE, a recurrent state in three of every four layers) has
    layer-range decode (patch 0012): `run --scheduler bevy` runs bevy, with no fallback line, and
    answers by the margin rule against stock --parallel 1, each recurrent state advanced once a token."""
    model = ensure_model(tiny_spec("qwen35moe", layers=4, experts=16, top_k=2), progress=False)
    work = ("--workload", "text", "--requests", "4", "-n", "8")
    proc = run_cli("run", model, *work, "--expert-cache", "25%", "--parallel", "4", "--json")
    assert "layer-range decode" not in proc.stderr
    got = json.loads(proc.stdout)
    assert got["stats"]["scheduler"] == "bevy" and got["stats"]["scheduler_note"] is None
    ref = run_json("run", model, "--engine", "stock", "--parallel", "1", *work)
    compared, mismatches = compare_by_margin_rule(ref, got)
    assert mismatches == 0 and compared >= 4 * 8 // 2
