"""`bevy` (self-balancing, layer-range decode) against stock llama.cpp by docs/correctness.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PROMPTS, compare_by_margin_rule, probe, run_json, run_probe, stock_alone, tiny_spec

from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model


def margin_ok(ref: dict, got: dict, n_requests: int, n_tokens: int) -> None:
    compared, mismatches = compare_by_margin_rule(ref, got)
    assert mismatches == 0
    assert compared >= n_requests * n_tokens // 2, f"only {compared} positions compared"


@pytest.mark.parametrize("cache", ["100%", "25%", "minimum"])
def test_bevy_follows_the_margin_rule(tmp_path: Path, layer_range_model: Path, cache: str) -> None:
    if cache == "minimum":
        layout = CacheLayout.of(inspect_model(layer_range_model))
        cache = str(layout.min_slots(1) * layout.slot_bytes)
    ref = stock_alone(layer_range_model, PROMPTS, 12)
    got = probe(layer_range_model, "bevy", cache, 8, tmp_path, prompts=PROMPTS, max_tokens=12)
    assert all(r["error"] is None for r in got["requests"])
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, 8, 12)
    assert got["pinned_after"] == 0


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_with_runahead_and_without_the_margin_rule_holds(tmp_path: Path, mode: str) -> None:
    """Runahead on, off (groups whole), or both in turn (auto: epochs of three steps here, so 24
    tokens measure each mode at least twice); the stats say which ran."""
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    ref = stock_alone(model, PROMPTS, 24)
    got = probe(model, "bevy", "25%", 8, tmp_path, prompts=PROMPTS, max_tokens=24, runahead=mode)
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, 8, 24)
    assert got["pinned_after"] == 0
    r = got["runahead"]
    if mode == "auto":
        assert r["runahead_epochs"] >= 2 and r["whole_epochs"] >= 2, r
        assert r["runahead_rate"] > 0 and r["whole_rate"] > 0, r
    else:
        assert r["whole_epochs" if mode == "on" else "runahead_epochs"] == 0, r
        assert r["runahead_epochs" if mode == "on" else "whole_epochs"] >= 4, r


@pytest.mark.parametrize("cache", ["50%", "twice-minimum"])
def test_a_single_lane_loads_each_missed_expert_once(tmp_path: Path, layer_range_model: Path, cache: str) -> None:
    """One thread, one lane: it keeps its waiting flights' reservations while it computes (the
    cache holds twice the minimum), so the loads that land meanwhile cannot evict them. Dropping
    them loaded experts that were evicted before use: 20-30% more loads than misses here, and
    twice the bytes of bevy-ctx on the default model at 50% (measured)."""
    layout = CacheLayout.of(inspect_model(layer_range_model))
    if cache == "twice-minimum":  # the smallest cache where the lane keeps them: half for each
        cache = str(2 * layout.min_slots(1) * layout.slot_bytes)
    link = f"throttle:{4000 * layout.slot_bytes}B/s:ram"  # emulated, 0.25 ms an expert: loads land while it computes
    ref = stock_alone(layer_range_model, PROMPTS, 12)
    got = probe(layer_range_model, "bevy", cache, 8, tmp_path, prompts=PROMPTS, max_tokens=12, threads=1, link=link)
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, 8, 12)
    c = got["counters"]
    assert 0 < c["loads"] <= c["misses"], c
    assert got["pinned_after"] == 0


@pytest.mark.parametrize("arch,threads", [("qwen2moe", 1), ("qwen2moe", 2), ("deepseek2", 2), ("qwen35moe", 2)])
def test_requests_join_and_leave(tmp_path: Path, arch: str, threads: int) -> None:
    """16 requests of different lengths through 4 sequences (one lane, or two): they join as
    others finish (deepseek2: in MLA's K-only cache; qwen35moe: a joining request's recurrent
    states start cleared in its cell, whoever held it)."""
    model = ensure_model(tiny_spec(arch, layers=4, experts=16, top_k=2), progress=False)
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS + PROMPTS[::-1])]
    ref = stock_alone(model, prompts, 10)
    got = probe(model, "bevy", "50%", 4, tmp_path, prompts=prompts, max_tokens=10, threads=threads)
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, 16, 10)


@pytest.mark.parametrize("arch,step,threads", [("mixtral", 3, 2), ("mixtral", 11, 2), ("mixtral", 17, 2),
                                               ("mixtral", 11, 1), ("deepseek2", 11, 2), ("qwen35moe", 11, 2),
                                               ("qwen35moe", 17, 1)])
def test_a_request_cancelled_mid_layer_leaves_cleanly(tmp_path: Path, arch: str, step: int, threads: int) -> None:
    """Cancelled between layer-range calls, its half-computed cells go; the request that then
    takes its sequence decodes correctly (stale cells would break its positions). Runahead on, so
    that a step's calls split its layers (whole-step calls would leave no point mid-layer)."""
    model = ensure_model(tiny_spec(arch, layers=4, experts=16, top_k=2), progress=False)
    prompts = PROMPTS[:5]
    ref = stock_alone(model, prompts, 16)
    got = probe(model, "bevy", "25%", 4, tmp_path, prompts=prompts, max_tokens=16, cancel=[[1, step]],
                threads=threads, runahead="on")
    assert got["cancelled_at"]["1"] is not None  # it was in flight, somewhere in its layers
    assert got["requests"][1]["error"] == "cancelled"
    others = {"requests": [r for i, r in enumerate(got["requests"]) if i != 1]}
    margin_ok({"requests": [r for i, r in enumerate(ref["requests"]) if i != 1]}, others, 4, 16)
    assert got["pinned_after"] == 0


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_small_experts_inside_pages_load_through_a_copy(tmp_path: Path, dtype: str) -> None:
    """Tensor data at gguf's default alignment (32): experts that are not whole pages (q8_0 64x64,
    4352 bytes) or too few for a page of room per slot (f16 64x64, 8 KiB: under ROOM_PAGES) take
    the O_DIRECT bounce copy; large whole-page ones do not (test_unaligned_reads.py)."""
    model = ensure_model(tiny_spec("mixtral", dtype=dtype, layers=4, experts=16, top_k=2), progress=False)
    got = probe(model, "bevy", "25%", 4, tmp_path, prompts=PROMPTS[:4], max_tokens=4)
    if got["link"] != "file (O_DIRECT)":
        pytest.skip(f"link {got['link']}: this file system has no O_DIRECT, so no bounce copy to avoid")
    assert got["counters"]["loads"] > 0
    assert got["counters"]["link_bounced"] > 0


def test_bevy_through_the_cli_and_json(layer_range_model: Path) -> None:
    doc = run_json("run", layer_range_model, "--workload", "text", "--requests", "8", "-n", "8",
                   "--scheduler", "bevy", "--expert-cache", "25%")
    s = doc["stats"]
    assert s["scheduler"] == "bevy" and s["tok_per_s"] > 0 and 0 < s["hit_rate"] <= 1 and s["bytes_loaded"] > 0
    t = s["lane_time"]  # where the step loop's time went
    assert t["calls_s"] > 0 and t["waits_s"] >= 0 and t["python_s"] >= 0 and t["python_per_call_ms"] > 0, t
    assert abs(t["loop_s"] - t["calls_s"] - t["waits_s"] - t["python_s"]) < 1e-6, t
    assert set(s["runahead"]) == {"runahead_rate", "whole_rate", "runahead_epochs", "whole_epochs"}


def test_the_lane_count_is_measured_unless_given(qwen3_tiny: Path) -> None:
    auto = run_json("run", qwen3_tiny, "-p", "Hello", "-p", "abc", "-np", "2", "-n", "4", "-t", "2",
                    "--expert-cache", "100%")["stats"]
    assert auto["lanes"] in (1, 2) and set(auto["lane_seconds"]) == {"1", "2"}
    assert all(s > 0 for s in auto["lane_seconds"].values())
    assert auto["lane_layers"] == inspect_model(qwen3_tiny).n_layer  # every expert in: whole steps
    given = run_json("run", qwen3_tiny, "-p", "Hello", "-p", "abc", "-np", "2", "-n", "4", "-t", "2",
                     "--expert-cache", "100%", "--lanes", "2")["stats"]
    assert given["lanes"] == 2 and given["lane_seconds"] == {} and given["lane_layers"] is None


@pytest.mark.parametrize("cache", ["50%", "75%"])
def test_the_lane_measurement_runs_the_layers_its_tokens_experts_fit(cache: str) -> None:
    """8 tokens, top 2 of 16 experts: up to 16 a layer, 64 over the 4 layers, which 32 or 48 slots
    cannot hold, so the worst case allows one layer; the calibration's own tokens route to fewer,
    and its calls run as many layers as those fit (calibrate.resident_layers: a call through one
    layer reads few weights, which a large CPU cache keeps hot, and misreads lanes). The timed
    calls load nothing (what it counted stays in), and a warm cache counts the same."""
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    got = run_probe(model, cache, 8, script="lanes_probe.py")
    assert got["worst_case"] == 1
    assert got["worst_case"] < got["resident"] == got["timed_layers"] == got["resident_warm"], got
    assert got["timing_loads"] == 0 and got["pinned_after"] == 0, got
    assert set(got["seconds"]) == {"1", "2"}


def test_second_passes_run_only_where_they_can_hide_a_load(qwen3_tiny: Path) -> None:
    """A second pass per MoE layer costs graph nodes on every layer (measured at start-up): with
    every expert in after the first steps, later calls run one pass; with two passes off, none."""
    args = ("run", qwen3_tiny, "-p", "Hello", "-p", "abc", "-np", "2", "-n", "24", "-t", "2", "--expert-cache", "100%")
    s = run_json(*args)["stats"]
    assert s["two_pass_overhead_s"] is not None and s["two_pass_overhead_s"] >= 0
    assert s["load_contention_s"] is not None and s["load_contention_s"] >= 0  # measured beside the first
    assert s["load_alone_s"] > 0  # and the link's own time per load, with nothing computing
    assert s["load_beside_s"] > 0  # ... and while a call computes
    assert 0 < s["two_pass_calls"] < s["layer_calls"], s  # the cold start's misses, then one pass
    off = run_json(*args, "--two-pass", "off")["stats"]
    assert off["two_pass_calls"] == 0 and off["two_pass_overhead_s"] is None and off["layer_calls"] > 0
    assert off["load_contention_s"] >= 0  # runahead overlaps loads with calls too: measured anyway


def test_long_prompts_prefill_in_layer_major_waves(tmp_path: Path) -> None:
    """Prompts of many chunks joining a running batch (12 requests through 4 sequences): the
    chunks of a wave pass each layer one after another, so they follow the margin rule as chunk
    after chunk does, and load a layer's experts once per wave instead of once per chunk. 20%: a
    cache below one layer's experts, so a prompt goes in micro-batched chunks (at 25% it holds a
    layer's 16, and a prompt is one call)."""
    model = ensure_model(tiny_spec("qwen3moe", layers=4, experts=16, top_k=2), progress=False)
    prompts = [(p + " ") * (8 + 4 * i) for i, p in enumerate(PROMPTS + PROMPTS[:4])]
    ref = stock_alone(model, prompts, 8)
    runs = {wave: probe(model, "bevy", "20%", 4, tmp_path, prompts=prompts, max_tokens=8, prefill_wave=wave)
            for wave in (1, 16)}
    for got in runs.values():
        margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, len(prompts), 8)
        assert got["pinned_after"] == 0
    chunks = [-(-len(p.encode()) // runs[16]["micro_batch"]) for p in prompts]
    assert max(chunks) >= 8, chunks  # the prompts are many chunks long
    loads = {wave: r["counters"]["loads"] for wave, r in runs.items()}
    assert loads[16] < 0.5 * loads[1], loads  # measured: 3,473 vs 19,053


def test_one_lane_at_a_time_prefills_in_larger_chunks(tmp_path: Path) -> None:
    """Two lanes of two sequences over 16 slots (4 layers of 16 experts, top-2, 25%): equal
    shares of 8 would cut prompt chunks to 4 tokens; a lane's decode step pins at most 4, so the
    lane holding the prompt permit prefills in chunks of 6 and the other in chunks of 2. Twelve
    long prompts join as others finish: some go with the permit, the margin rule holds, and
    no pin is left (the pins never exceed the cache: a call waiting for a slot no one frees
    would time out)."""
    model = ensure_model(tiny_spec("qwen3moe", layers=4, experts=16, top_k=2), progress=False)
    prompts = [(p + " ") * (8 + 4 * i) for i, p in enumerate(PROMPTS + PROMPTS[:4])]
    ref = stock_alone(model, prompts, 8)
    got = probe(model, "bevy", "25%", 4, tmp_path, prompts=prompts, max_tokens=8, lanes=2)
    assert all(r["error"] is None for r in got["requests"])
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, len(prompts), 8)
    assert got["lanes"] == 2 and (got["micro_batch"], got["permit_chunk"]) == (2, 6)
    assert 0 < got["permit_prompts"] <= len(prompts)
    assert got["pinned_after"] == 0
    # four prompts for four sequences: every decode waits until both lanes' prompts are in
    burst = probe(model, "bevy", "25%", 4, tmp_path, prompts=prompts[-4:], max_tokens=8, lanes=2)
    margin_ok(stock_alone(model, prompts[-4:], 8), burst, 4, 8)
    assert burst["permit_prompts"] > 0 and burst["pinned_after"] == 0


def test_running_requests_decode_while_a_prompt_prefills(tmp_path: Path) -> None:
    """Prompts of many waves joining running requests hold their decode by about one wave per
    token, not by the whole prompt (a wave takes the lane's step clock, so the decode tokens of
    that step ride with it): a decoding request's tokens are never further apart than the waves
    its lane can have in flight (measured: at most 42 scheduling steps here, against 3,596 when a
    prompt led every decode token to its end), and the margin rule holds."""
    model = ensure_model(tiny_spec("qwen3moe", layers=4, experts=16, top_k=2), progress=False)
    prompts = [(p + " ") * (8 + 4 * i) for i, p in enumerate(PROMPTS + PROMPTS[:4])]
    ref = stock_alone(model, prompts, 24)
    n_seq, wave = 4, 2
    got = probe(model, "bevy", "20%", n_seq, tmp_path, prompts=prompts, max_tokens=24, prefill_wave=wave,
                threads=1, trace=True)
    margin_ok(ref, {"requests": [{"tokens": r["tokens"]} for r in got["requests"]]}, len(prompts), 24)
    trace = got["trace"]  # one entry per scheduling step (a call, or a wait for loads)
    prefill_steps = max(sum(x in s["prefilling"] for s in trace) for x in range(len(prompts)))
    bound = 2 * n_seq * wave * (4 + 1)  # every sequence's wave through every layer, twice over
    assert prefill_steps > 10 * bound  # a prompt long enough to starve decode if it led
    for y in range(len(prompts)):
        since, last, gap = 0, None, 0
        for n, s in enumerate(trace):
            if y not in s["decoding"]:
                last = None
                continue
            if s["decoded"][y] != last:
                since, last = n, s["decoded"][y]
            gap = max(gap, n - since)
        assert gap <= bound, (y, gap, bound)


def test_a_cache_of_every_expert_runs_whole_resident_steps(tmp_path: Path, layer_range_model: Path) -> None:
    """At 100% the cache loads every expert at start-up, and bevy then decodes each step in one
    whole-step call outside the plan (blocking's schedule without the scheduling), still by the
    margin rule against stock alone; below 100% it never does."""
    ref = stock_alone(layer_range_model, PROMPTS, 8)
    full = probe(layer_range_model, "bevy", "100%", 8, tmp_path, prompts=PROMPTS, max_tokens=8)
    compared, mismatches = compare_by_margin_rule(ref, full)
    assert mismatches == 0 and compared >= len(PROMPTS) * 8 // 2
    assert full["counters"]["misses"] == 0  # the start-up fill: no lookup missed
    for cache, resident in (("100%", True), ("25%", False)):
        doc = run_json("run", layer_range_model, "--workload", "text", "--requests", "8", "-n", "8",
                       "--scheduler", "bevy", "--expert-cache", cache)
        s = doc["stats"]
        assert (s["resident_calls"] > 0) == resident, cache
        assert (s["expert_cache_fill_s"] > 0) == resident and (s["hit_rate"] == 1.0) == resident, cache


CACHE_RARE, PARALLEL_RARE = "75%", 2  # two sequences' experts fit: after their prompts, steps rarely miss


def test_steps_that_rarely_miss_run_whole_outside_the_plan(tmp_path: Path, layer_range_model: Path) -> None:
    """With groups kept whole and a cache where a step expects under one miss by the lane's miss
    rates, steps run as whole calls outside the plan (resident_steps rare-misses), a miss stalling
    the call as blocking's; with all-in only a cache of every expert does. Both by the margin rule."""
    ref = stock_alone(layer_range_model, PROMPTS, 24)
    for mode, whole in (("rare-misses", True), ("all-in", False)):
        got = probe(layer_range_model, "bevy", CACHE_RARE, PARALLEL_RARE, tmp_path, prompts=PROMPTS, max_tokens=24,
                    runahead="off", lanes=1, resident_steps=mode)
        assert all(r["error"] is None for r in got["requests"])
        assert (got["resident_calls"] > 0) == whole, (mode, got["resident_calls"])
        compared, mismatches = compare_by_margin_rule(ref, got)
        assert mismatches == 0 and compared >= len(PROMPTS) * 24 // 2, (mode, compared)
        assert got["pinned_after"] == 0


def test_every_call_runs_its_rows_in_sequence_order(tmp_path: Path, layer_range_model: Path) -> None:
    """Requests that finish at different steps free their sequences out of order, and those that
    join take them; a call's rows still go by sequence id, in whole resident steps (100%) and in
    planned calls (25%). With a KV stream per sequence llama.cpp splits a call into a ubatch per run
    of consecutive ids, each computing every layer of the call again (measured, default model at
    100%, one lane, serving stream: 3.65x the layer computes of sorted calls, 0.72x the tok/s)."""
    max_tokens = [4 + 3 * (i % 3) for i in range(len(PROMPTS))]
    ref = stock_alone(layer_range_model, PROMPTS, max(max_tokens))
    for cache in ("100%", "25%"):
        got = probe(layer_range_model, "bevy", cache, 3, tmp_path, prompts=PROMPTS, max_tokens=max_tokens,
                    lanes=1, seq_order=True)
        assert all(r["error"] is None for r in got["requests"])
        order = got["seq_order"]
        assert order["calls"] > 0 and order["out_of_order"] == 0, (cache, order)
        compared, mismatches = compare_by_margin_rule(ref, got)
        assert mismatches == 0 and compared >= sum(max_tokens) // 2, (cache, compared)


def test_prompt_calls_on_every_thread_follow_the_margin_rule(layer_range_model: Path) -> None:
    """--wide-prefill: with two lanes, each call with a prompt chunk runs on both threads, alone
    at the compute gate; the decode calls go back to the lane's thread, and the answers follow
    the margin rule."""
    ref = stock_alone(layer_range_model, PROMPTS, 12)
    args = ("run", layer_range_model, *(a for p in PROMPTS for a in ("-p", p)), "-np", "8", "-n", "12", "-t", "2",
            "--expert-cache", "25%", "--lanes", "2")
    wide = run_json(*args, "--wide-prefill")
    assert wide["stats"]["lanes"] == 2 and wide["stats"]["wide_calls"] > 0
    assert 0 < wide["stats"]["wide_calls"] < wide["stats"]["layer_calls"]
    margin_ok(ref, wide, 8, 12)
    assert run_json(*args)["stats"]["wide_calls"] == 0
