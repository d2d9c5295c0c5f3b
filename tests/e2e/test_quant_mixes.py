"""Files as users have them: llama-quantize's mixes (experts of several types and sizes across
layers), served from one expert cache in slot classes, against stock llama.cpp by
docs/correctness.md.

Flash attention is off throughout: on these 256-wide models stock llama.cpp's CPU flash
attention gives a token's logits that depend on what it is batched with (measured: stock
--parallel 8 against --parallel 1 differ by up to 0.19 in a margin at the first decoded
position, and break the margin rule), while without it stock is batch-invariant (equal to the
bit), so the references below mean what the rule says."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PROMPTS, compare_by_margin_rule, probe, quant_spec, run_json

from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model

# (llama-quantize type, --tensor-type overrides): K-quant mixes, an IQ type, a legacy type, a dynamic-like mix
MIXES = [("Q4_K_M", ()), ("Q5_K_M", ()), ("Q3_K_M", ()), ("IQ4_XS", ()), ("Q4_0", ()),
         ("Q4_K_M", ("blk.0.ffn_up_exps=q8_0", "ffn_gate_exps=iq4_nl"))]
N_TOKENS = 8
FA = ("-fa", "off")


def mix_id(mix: tuple[str, tuple[str, ...]]) -> str:
    return mix[0] + ("+tt" if mix[1] else "")


@pytest.fixture(scope="module", params=[(m, a) for m in MIXES for a in ("qwen3moe", "mixtral")],
                ids=lambda p: f"{mix_id(p[0])}-{p[1]}")
def quant_model(request: pytest.FixtureRequest) -> Path:
    """4 layers of 16 experts (64 in all), top-2: 25% of each slot class holds what 8 contexts need."""
    (quantize, tensor_types), arch = request.param
    return ensure_model(quant_spec(quantize, arch=arch, tensor_types=tensor_types, experts=16), progress=False)


def minimum(model: Path) -> str:
    return str(CacheLayout.of(inspect_model(model)).min_bytes())


def texts(doc: dict) -> list[list[int]]:
    return [r["tokens"] for r in doc["requests"]]


def margin_ok(ref: dict, got: dict, what: str) -> None:
    compared, mismatches = compare_by_margin_rule(ref, {"requests": [{"tokens": t} for t in texts(got)]})
    assert mismatches == 0, what
    assert compared >= len(ref["requests"]) * N_TOKENS // 2, f"{what}: only {compared} positions compared"


def stock_and_unsplit(model: Path) -> tuple[dict, dict]:
    """(stock batched, stock --parallel 1) of the prompts, after checking blocking unsplit against
    stock batched, exactly (also on the types stock repacks, Q4_0 -> q4_0_8x8 with AVX2: the
    slots are repacked the same way and run the same kernels)."""
    args = [a for p in PROMPTS for a in ("-p", p)]
    batched = run_json("run", model, "--engine", "stock", "--parallel", "8", "-n", str(N_TOKENS), *FA, *args)
    alone = run_json("run", model, "--engine", "stock", "--parallel", "1", "-n", str(N_TOKENS), *FA, *args)
    unsplit = run_json("run", model, "--scheduler", "blocking", "--expert-cache", "100%", "--parallel", "8",
                       "-n", str(N_TOKENS), *FA, *args)
    assert texts(unsplit) == texts(batched)  # blocking unsplit = stock batched, exactly
    return batched, alone


def test_the_mixes_have_what_they_test() -> None:
    """Q4_K_M gives ffn_down two types (two slot classes); the per-tensor mix gives a third layout."""
    layouts = {mix_id(m): CacheLayout.of(inspect_model(ensure_model(quant_spec(m[0], tensor_types=m[1], experts=16),
                                                                    progress=False))) for m in MIXES}
    assert len(layouts["Q4_K_M"].classes) == 2 and len(layouts["Q4_0"].classes) == 1
    assert len(layouts["Q4_K_M+tt"].classes) == 3


def test_every_scheduler_on_the_mix(tmp_path: Path, quant_model: Path) -> None:
    batched, alone = stock_and_unsplit(quant_model)
    spec = {"prompts": PROMPTS, "max_tokens": N_TOKENS, "flash_attn": "off"}
    for cache in ("25%", minimum(quant_model)):
        blocking = probe(quant_model, "blocking", cache, 8, tmp_path, **spec)
        margin_ok(batched, blocking, f"blocking at {cache}")
        assert blocking["counters"]["misses"] > 0 and blocking["pinned_after"] == 0
    for cache in ("100%", "25%", minimum(quant_model)):
        bevy = probe(quant_model, "bevy", cache, 8, tmp_path, **spec)
        assert all(r["error"] is None for r in bevy["requests"]) and bevy["pinned_after"] == 0
        margin_ok(alone, bevy, f"bevy at {cache}")
    for cache, parallel in (("100%", 8), ("25%", 2), (minimum(quant_model), 1)):  # contexts the classes hold
        ctx = probe(quant_model, "bevy-ctx", cache, parallel, tmp_path, **spec)
        assert texts(ctx) == texts(alone), f"bevy-ctx at {cache}, {parallel} contexts"  # = stock --parallel 1


@pytest.mark.parametrize("mix", MIXES, ids=mix_id)
@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
def test_the_budget_holds_and_wastes_little(mix: tuple[str, tuple[str, ...]], share: float) -> None:
    info = inspect_model(ensure_model(quant_spec(mix[0], tensor_types=mix[1], experts=16), progress=False))
    layout = CacheLayout.of(info)
    assert layout.expert_bytes == info.expert_bytes
    budget = int(share * info.expert_bytes)
    with ExpertCache(info, budget, LinkSpec.parse("ram")) as cache:
        assert cache.budget_bytes <= budget
        assert cache.wasted_bytes == budget - cache.budget_bytes < 0.05 * budget
        assert cache.n_slots == sum(cache.class_slots)
        for n, c in zip(cache.class_slots, layout.classes):  # each class: its share of its experts
            assert abs(n / (len(c.layers) * layout.n_expert) - share) <= 0.1


# the legacy and IQ4_NL types in one file: one kind each (--tensor-type), the rest Q5_0
LEGACY_TYPES = ("ffn_gate_exps=q4_1", "ffn_up_exps=q5_1", "ffn_down_exps=iq4_nl")


@pytest.mark.parametrize("quantize,tensor_types", [(q, ()) for q in ("MXFP4_MOE", "Q2_K", "Q6_K", "IQ3_M", "BF16",
                                                                     "IQ2_XXS", "IQ1_M", "F32")]
                         + [("Q5_0", LEGACY_TYPES)])
def test_more_expert_types(tmp_path: Path, quantize: str, tensor_types: tuple[str, ...]) -> None:
    """More of the types the CPU mul_mat_id runs (MXFP4, Q2_K with Q3_K down, Q6_K, IQ3_S, BF16,
    IQ2_XXS and IQ1_M through a flat importance matrix, F32; Q4_1, Q5_1 and IQ4_NL experts): blocking
    unsplit against stock batched, bevy at 25% by the margin rule."""
    model = ensure_model(quant_spec(quantize, tensor_types=tensor_types, experts=16), progress=False)
    if tensor_types:
        assert {(t.kind, t.ggml_type) for t in inspect_model(model).expert_tensors} == {
            ("gate", "Q4_1"), ("up", "Q5_1"), ("down", "IQ4_NL")}
    _, alone = stock_and_unsplit(model)
    bevy = probe(model, "bevy", "25%", 8, tmp_path, prompts=PROMPTS, max_tokens=N_TOKENS, flash_attn="off")
    assert all(r["error"] is None for r in bevy["requests"]) and bevy["counters"]["misses"] > 0
    margin_ok(alone, bevy, "bevy at 25%")
