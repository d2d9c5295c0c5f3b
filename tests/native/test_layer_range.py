"""llama_decode_layers (patch 0003): layer-range calls reproduce llama_decode."""

from __future__ import annotations

from pathlib import Path

from conftest import run_probe


def test_layer_calls_match_llama_decode(layer_range_model: Path) -> None:
    """A prompt one layer per call (each call resuming after the attention its predecessor's
    lookahead ran), a token with merged layers, and a token whose sequence is regrouped while it
    is half done (qwen35moe: its recurrent state moves to another cell) give llama_decode's
    logits, bit for bit."""
    out = run_probe(str(layer_range_model), script="layers_probe.py")
    assert out["logit_scale"] > 1.0  # real logits, not zeros
    assert out["prompt_max_diff"] == 0.0
    assert out["merged_max_diff"] == 0.0
    assert out["regroup_max_diff"] == 0.0  # a recurrent state moved mid-token moves in every layer
    assert "failed" in out["partial_without_lookahead"]  # a partial range must end with the lookahead
    assert "failed" in out["reuse_without_hidden"]        # resuming needs the lookahead's output
