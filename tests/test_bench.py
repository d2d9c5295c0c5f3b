"""`bevy-gguf bench`: the harness on a tiny model (structure, every system ran, the cgroup path).

No timing is asserted here: performance is judged by the bench's own side-by-side ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli, tiny_spec

from bevy_gguf.bench.memcap import MemoryCap
from bevy_gguf.bench.report import markdown, ratio_table
from bevy_gguf.models import ensure_model

SYSTEMS = ["stock-resident", "stock-offload", "blocking", "prefetch", "bevy-ctx", "bevy"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    out = tmp_path_factory.mktemp("bench")
    proc = run_cli("bench", model, "--sweep", "cache=25%,100%", "--repeats", "2", "--steps", "6", "--out", out,
                   "--json")
    return json.loads(proc.stdout), out


def test_every_system_ran_at_every_cache_point(bench: tuple[dict, Path]) -> None:
    doc, _ = bench
    rows = {(r["system"], r["cache"]) for r in doc["runs"]}
    assert ("stock-resident", 100.0) in rows
    for system in SYSTEMS[1:]:
        assert {(system, 25.0), (system, 100.0)} <= rows
    for r in doc["runs"]:
        if r["system"] == "stock-offload" and r["status"].startswith("unavailable"):
            continue  # said why (no cgroup here): allowed, never a stand-in number
        assert r["status"] == "ok", r
        assert len(r["repeats"]) == 2 and r["tok_per_s"] > 0
        assert r["tpot_p50_ms"] <= r["tpot_p99_ms"] and r["ttft_ms"] > 0
        if r["system"] not in ("stock-resident", "stock-offload"):
            assert 0 <= r["hit_rate"] <= 1 and r["bytes_loaded"] >= 0 and 0 < r["overlap_efficiency"] <= 1.05
            assert r["cache_bytes"] > 0 and r["pct_of_bound"] > 0


def test_bound_and_protocol(bench: tuple[dict, Path]) -> None:
    doc, _ = bench
    assert [b["cache"] for b in doc["bound"]] == [25.0, 100.0]
    b25, b100 = doc["bound"]
    assert b25["belady_misses"] >= b100["belady_misses"] >= 0
    assert b25["tok_per_s"] <= b100["tok_per_s"]
    p = doc["protocol"]
    assert p["requests"] == 8 and p["steps"] == 6 and p["repeats"] == 2 and p["workload"] == "text"
    assert {r["ratio"] for r in doc["ratios"]} >= {"bevy / blocking", "bevy / prefetch", "bevy / bevy-ctx"}


def test_outputs_written(bench: tuple[dict, Path]) -> None:
    doc, out = bench
    assert json.loads((out / "report.json").read_text())["runs"] == doc["runs"]
    md = (out / "report.md").read_text()
    assert "| bevy |" in md and ("Link: file (O_DIRECT)" in md or "Link: file (buffered" in md)
    if "Link: file (O_DIRECT)" in md:  # the tiny q8_0 model's experts (4352 bytes) are not whole pages
        assert "experts through a bounce buffer" in md
        assert all(r["link_bounced"] > 0 for r in doc["runs"] if r["system"] == "bevy")
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((out / "timeline.json").read_text())["traceEvents"]
    cats = {e.get("cat") for e in trace}
    assert {"wait", "compute", "load"} <= cats
    assert any(e.get("args", {}).get("name") == "bevy: link" for e in trace)


def test_stock_offload_cgroup_works_or_says_why() -> None:
    cap = MemoryCap(64 * 2**20)
    try:
        assert cap.available or cap.reason
    finally:
        cap.close()


def test_emulated_link_is_named(tmp_path: Path) -> None:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    proc = run_cli("bench", model, "--systems", "blocking,bevy", "--repeats", "1", "--steps", "3", "--link",
                   "throttle:20MB/s")
    assert "Link: emulated 20 MB/s over file" in proc.stdout


def test_ratio_table_and_markdown_handle_missing_rows() -> None:
    report = {"protocol": {"model": "m.gguf", "model_bytes": 1, "expert_bytes": 1, "slot_bytes": 1, "machine": "x",
                           "workload": "text", "requests": 1, "prompt_tokens": 1, "steps": 1, "parallel": 1,
                           "threads": 1, "link": "file", "repeats": 1},
              "runs": [{"system": "bevy", "cache": 25.0, "tok_per_s": 10.0, "pct_of_bound": None,
                        "tpot_p50_ms": None, "tpot_p99_ms": None, "ttft_ms": None, "hit_rate": None,
                        "bytes_loaded": None, "overlap_efficiency": None, "status": "ok"},
                       {"system": "stock-offload", "cache": 25.0, "tok_per_s": None, "pct_of_bound": None,
                        "tpot_p50_ms": None, "tpot_p99_ms": None, "ttft_ms": None, "hit_rate": None,
                        "bytes_loaded": None, "overlap_efficiency": None, "status": "unavailable: no cgroup"}],
              "bound": []}
    assert ratio_table(report) == []
    assert "unavailable: no cgroup" in markdown(report, "bevy-gguf bench m.gguf")


def test_bad_bench_arguments(qwen3_tiny: Path) -> None:
    for args, fragment in ((["--systems", "llama"], "unknown system"), (["--sweep", "size=1"], "cache=25%")):
        proc = run_cli("bench", qwen3_tiny, *args, check=False)
        assert proc.returncode != 0 and fragment in proc.stderr and "Traceback" not in proc.stderr


def test_the_bound_computes_at_the_fastest_all_resident_speed_measured() -> None:
    from bevy_gguf.bench.harness import fastest_compute_s

    resident = [{"decode_s": 2.0}, {"decode_s": 2.2}, {"error": "killed"}]
    rows = [{"cache": 100.0, "tok_per_s": 512.0}, {"cache": 25.0, "tok_per_s": 5000.0},
            {"cache": 100.0, "tok_per_s": None}]
    assert fastest_compute_s(resident, rows, 512) == 1.0  # a system at 100% beat stock-resident
    assert fastest_compute_s(resident, rows[1:], 512) == 2.1  # only a 100% cache counts as resident
    assert fastest_compute_s([], [], 512) is None
