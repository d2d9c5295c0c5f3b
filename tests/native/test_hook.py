"""patches/0001: the MoE hook is inert without a hook, exact with an identity hook, and safe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import probe_logits, tiny_spec

from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model


def test_no_hook_is_bit_identical_to_stock(tmp_path: Path, tiny_model: Path) -> None:
    _, stock = probe_logits(tmp_path, "stock", tiny_model)
    _, patched = probe_logits(tmp_path, "patched", tiny_model)
    assert stock.shape == (15, 260)
    assert np.array_equal(stock, patched), f"max |diff| {np.abs(stock - patched).max()}"


def test_no_hook_is_bit_identical_f16(tmp_path: Path) -> None:
    model = ensure_model(tiny_spec("qwen2moe", dtype="f16"), progress=False)
    _, stock = probe_logits(tmp_path, "stock", model)
    _, patched = probe_logits(tmp_path, "patched", model)
    assert np.array_equal(stock, patched)


def test_identity_hook_is_bit_identical_and_sees_every_token(tmp_path: Path, tiny_model: Path) -> None:
    _, stock = probe_logits(tmp_path, "stock", tiny_model)
    result, traced = probe_logits(tmp_path, "patched", tiny_model, "trace")
    assert np.array_equal(stock, traced)
    n_prompt = sum(result["prompt_tokens"])
    decode_rows = 3 * 4
    moe = inspect_model(tiny_model).moe_layers
    rows = result["trace_rows"]
    # a dense layer has no hook; every MoE layer but the last computes every token; the last
    # only the rows that output logits (gpt-oss's and qwen35moe's builders drop the others after it)
    assert [rows[il] for il in range(len(rows)) if il not in moe] == [0] * (len(rows) - len(moe))
    assert [rows[il] for il in moe[:-1]] == [n_prompt + decode_rows] * (len(moe) - 1)
    arch = inspect_model(tiny_model).arch
    assert rows[moe[-1]] == (n_prompt if arch in ("gpt-oss", "qwen35moe") else 3) + decode_rows
    for il in moe:
        for row in result["trace_ids"][il]:
            assert len(set(row)) == len(row) == 2 and all(0 <= e < 8 for e in row)


def test_hook_installed_after_first_decode_takes_effect(tmp_path: Path, qwen3_tiny: Path) -> None:
    """The hook is part of the graph-reuse key: a reused graph would skip it."""
    result, _ = probe_logits(tmp_path, "patched", qwen3_tiny, "trace", "--hook-after-first")
    assert result["error"] is None
    assert result["trace_rows"][0] == 3 * 3  # installed before step 1: steps 1..3 of 3 sequences


def test_remapped_ids_reach_the_expert_matmuls(tmp_path: Path, qwen3_tiny: Path) -> None:
    _, stock = probe_logits(tmp_path, "stock", qwen3_tiny)
    _, shifted = probe_logits(tmp_path, "patched", qwen3_tiny, "shift")
    assert shifted.shape == stock.shape and not np.array_equal(stock, shifted)


@pytest.mark.parametrize("hook", ["bad-id", "fail"])
def test_bad_hook_output_fails_the_decode_not_the_process(tmp_path: Path, qwen3_tiny: Path, hook: str) -> None:
    result, logits = probe_logits(tmp_path, "patched", qwen3_tiny, hook)
    assert result["error"] is not None and "code -3" in result["error"]
    assert logits.size == 0
