"""The call cost model: it learns a machine's costs from the calls it sees."""

from __future__ import annotations

import random

import pytest

from bevy_gguf.engine.cost_model import MIN_OBSERVATIONS, CallCostModel, CallShape

TRUE = {"fixed": 2e-4, "per_layer": 1e-4, "per_token_layer": 3e-5, "per_expert": 8e-5, "per_context_layer": 1e-8}


def true_seconds(s: CallShape) -> float:
    return (TRUE["fixed"] + TRUE["per_layer"] * s.layers + TRUE["per_token_layer"] * s.tokens * s.layers
            + TRUE["per_expert"] * s.experts + TRUE["per_context_layer"] * s.context * s.layers)


def shapes(n: int, seed: int = 0) -> list[CallShape]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        layers, tokens = rng.randint(1, 8), rng.randint(1, 16)
        out.append(CallShape(layers, tokens, experts=layers * rng.randint(2, min(64, 8 * tokens)),
                             context=tokens * rng.randint(16, 600)))
    return out


def test_the_fit_recovers_a_machines_costs_and_predicts_new_calls() -> None:
    model = CallCostModel()
    for s in shapes(400):
        model.observe(s, true_seconds(s))
    for s in shapes(50, seed=1):
        assert model.predict(s) == pytest.approx(true_seconds(s), rel=0.02)
    fitted = model.as_dict()
    assert fitted["calls"] == 400 and fitted["per_expert"] == pytest.approx(TRUE["per_expert"], rel=0.05)


def test_it_follows_the_machine_when_it_slows_down() -> None:
    model = CallCostModel()
    for s in shapes(300):
        model.observe(s, true_seconds(s))
    for s in shapes(600, seed=2):  # the machine is now twice as slow (another tenant, a throttled core)
        model.observe(s, 2 * true_seconds(s))
    s = CallShape(1, 8, 30, 2000)
    assert model.predict(s) == pytest.approx(2 * true_seconds(s), rel=0.05)


def test_before_it_has_seen_enough_it_says_so_or_scales_what_it_saw() -> None:
    model = CallCostModel()
    assert model.predict(CallShape(1, 1, 8, 10)) is None
    model.observe(CallShape(2, 4, 16, 100), 0.008)  # 1 ms per token-layer
    assert model.predict(CallShape(1, 3, 8, 10)) == pytest.approx(0.003)
    model.observe(CallShape(0, 4, 0, 0), 1.0)  # no layer computed (an embedding call): not a sample
    model.observe(CallShape(1, 1, 8, 10), -1.0)
    assert model.n == 1 < MIN_OBSERVATIONS
