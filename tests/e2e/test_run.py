"""`bevy-gguf run --engine stock`: texts, the run JSON, batched and one-at-a-time references."""

from __future__ import annotations

from pathlib import Path

from conftest import compare_by_margin_rule, run_cli, run_json


def test_json_contract(qwen3_tiny: Path) -> None:
    doc = run_json("run", qwen3_tiny, "-p", "Hello", "-p", "Wörld", "--engine", "stock", "--parallel", "2", "-n", "5")
    assert set(doc) == {"requests", "stats"}
    assert [r["prompt"] for r in doc["requests"]] == ["Hello", "Wörld"]
    for r in doc["requests"]:
        assert set(r) == {"prompt", "text", "tokens", "margins"}
        assert len(r["tokens"]) == len(r["margins"]) == 5 or r["tokens"][-1] == 2
        assert all(m >= 0 for m in r["margins"])
    assert doc["stats"]["tok_per_s"] > 0
    assert {k: doc["stats"][k] for k in ("hit_rate", "bytes_loaded", "stall_s", "link")} == dict.fromkeys(
        ("hit_rate", "bytes_loaded", "stall_s", "link"))


def test_batched_equals_one_at_a_time_by_margin_rule(tiny_model: Path) -> None:
    args = ("run", tiny_model, "--engine", "stock", "--workload", "text", "--requests", "8", "-n", "24")
    if "deepseek2" in tiny_model.name:  # MLA: CPU flash attention's kernel depends on the batch (docs/correctness.md)
        args += ("-fa", "off")
    batched = run_json(*args, "--parallel", "8")
    alone = run_json(*args, "--parallel", "1")
    compared, mismatches = compare_by_margin_rule(alone, batched)
    assert mismatches == 0
    assert compared >= 8 * 24 // 2, f"only {compared} positions compared"


def test_more_requests_than_parallel(qwen3_tiny: Path) -> None:
    prompts = [f"prompt number {i}" for i in range(5)]
    doc = run_json("run", qwen3_tiny, *sum((["-p", p] for p in prompts), []), "--engine", "stock", "--parallel", "2",
                   "-n", "4")
    assert [r["prompt"] for r in doc["requests"]] == prompts
    alone = run_json("run", qwen3_tiny, "-p", prompts[4], "--engine", "stock", "--parallel", "1", "-n", "4")
    assert compare_by_margin_rule(alone, {"requests": doc["requests"][4:]})[1] == 0


def test_text_output_for_eight_prompts_from_stdin(qwen3_tiny: Path) -> None:
    stdin = "\n".join(f"line {i}: ünïcödé" for i in range(8)) + "\n"
    out = run_cli("run", qwen3_tiny, "--engine", "stock", "--parallel", "8", "-n", "6", stdin=stdin).stdout
    assert out.count("--- request") == 8
    assert "line 7: ünïcödé\u2192" in out
    assert "engine stock, parallel 8:" in out
