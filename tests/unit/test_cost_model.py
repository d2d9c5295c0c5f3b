"""The call cost model: it learns a machine's costs from the calls it sees."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from bevy_gguf.engine.cost_model import FEATURES, MIN_OBSERVATIONS, CallCostModel, CallShape, nnls_gram

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


def test_nnls_matches_the_best_non_negative_solution_found_by_brute_force() -> None:
    rng = np.random.default_rng(3)
    x = rng.random((60, 4))
    y = x @ np.array([2.0, -1.0, 0.5, 0.0]) + 0.01 * rng.standard_normal(60)
    w = nnls_gram(x.T @ x, x.T @ y)
    assert (w >= 0).all()
    best = np.inf
    for mask in itertools.product([False, True], repeat=4):  # every support: the constrained optimum is one of them
        cols = np.flatnonzero(mask)
        v = np.zeros(4)
        if len(cols):
            v[cols] = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (v >= 0).all():
            best = min(best, float(np.sum((x @ v - y) ** 2)))
    assert float(np.sum((x @ w - y) ** 2)) == pytest.approx(best, rel=1e-6)
    for start in (w, np.ones(4), np.array([0.0, 1.0, 0.0, 1.0])):  # warm starts, good and bad
        assert nnls_gram(x.T @ x, x.T @ y, start=start) == pytest.approx(w, abs=1e-9)


def test_decode_calls_whose_features_move_together_get_no_negative_cost() -> None:
    # decode: the distinct experts and the context grow with tokens x layers, so the features are
    # nearly collinear; an unconstrained fit trades them against each other and goes negative
    rng = random.Random(0)
    model = CallCostModel()
    for _ in range(400):
        layers, tokens = rng.choice([1, 1, 1, 2, 4]), rng.choice([4, 8])
        s = CallShape(layers, tokens, experts=round(layers * tokens * 8 * rng.uniform(0.85, 0.9)),
                      context=tokens * rng.randint(100, 110))
        model.observe(s, true_seconds(s) * rng.uniform(0.9, 1.1))
    fitted = model.as_dict()
    assert all(fitted[name] >= 0 for name in FEATURES)
    one_more_call = TRUE["fixed"] + TRUE["per_layer"]
    assert 0 <= model.call_overhead() <= 4 * one_more_call
    s = CallShape(1, 8, 60, 850)
    assert model.predict(s) == pytest.approx(true_seconds(s), rel=0.1)


def test_link_time_per_load_follows_the_loads_as_they_came() -> None:
    from bevy_gguf.engine.cost_model import LinkTimePerLoad

    t = LinkTimePerLoad(decay=0.5)
    assert t.update(0, 0) is None  # no load yet
    assert t.update(4_000_000, 4) == pytest.approx(1e-3)  # 4 loads in 4 ms of link time: 1 ms each
    assert t.update(4_000_000, 4) == pytest.approx(1e-3)  # nothing new: unchanged
    # one lone load of 3 ms moves it half way; two queued ones of 0.5 ms each, three quarters
    assert t.update(7_000_000, 5) == pytest.approx(2e-3)
    assert t.update(8_000_000, 7) == pytest.approx(2e-3 + 0.75 * (0.5e-3 - 2e-3))


def test_a_second_pass_costs_what_calls_with_and_without_one_computed() -> None:
    # whole-step calls of 8 MoE layers, some in two passes: a second pass adds 0.5 ms a layer
    rng = random.Random(1)
    model = CallCostModel()
    for i in range(3):  # calls of one kind only: its cost cannot be told from the per-layer cost
        s = CallShape(8, 8, experts=8 * 30, context=8 * 100 * (i + 1), two_pass_layers=8)
        model.observe(s, true_seconds(s) + 8 * 5e-4)
    assert model.two_pass_overhead() is None and model.as_dict()["two_pass_overhead"] is None
    for i in range(60):
        two = i % 3 == 0
        s = CallShape(8, 8, experts=8 * rng.randint(25, 35), context=8 * rng.randint(100, 400),
                      two_pass_layers=8 if two else 0)
        model.observe(s, true_seconds(s) + (8 * 5e-4 if two else 0.0))
    assert model.two_pass_overhead() == pytest.approx(5e-4, rel=0.05)
    assert model.as_dict()["per_two_pass_layer"] == pytest.approx(5e-4, rel=0.05)


def test_loads_landing_beside_a_call_are_not_taken_for_its_second_passes() -> None:
    # second passes run while loads move, and on a link that copies through the CPU each load
    # takes 80 us of compute from the call; one-pass calls see a few (the other lane's)
    rng = random.Random(2)
    model = CallCostModel()
    for i, shape in enumerate(shapes(400)):
        two = i % 2 == 0
        beside = rng.randint(8, 20) if two else rng.randint(0, 6)
        s = dataclasses.replace(shape, two_pass_layers=shape.layers if two else 0, loads_beside=beside)
        model.observe(s, true_seconds(s) + 3e-5 * s.two_pass_layers + 8e-5 * beside)
    assert model.two_pass_overhead() == pytest.approx(3e-5, rel=0.05)  # not 30 us + the loads' 80 us each
    assert model.as_dict()["per_load_beside"] == pytest.approx(8e-5, rel=0.05)
    s = CallShape(1, 8, 30, 2000)  # a prediction is of a call with nothing loading beside it
    assert model.predict(s) == pytest.approx(true_seconds(s), rel=0.05)
