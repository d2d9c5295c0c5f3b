"""Greedy choice and its margin (the margin rule's reference, docs/correctness.md)."""

from __future__ import annotations

import numpy as np
import pytest

from bevy_gguf.engine.sampling import greedy


@pytest.mark.parametrize("seed", range(20))
def test_greedy_is_the_argmax_and_the_gap_to_the_runner_up(seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(1000).astype(np.float32)
    order = np.argsort(-x, kind="stable")
    assert greedy(x) == (int(order[0]), pytest.approx(float(x[order[0]] - x[order[1]])))


def test_ties_go_to_the_lower_token_id() -> None:
    x = np.zeros(10, dtype=np.float32)
    x[[7, 3, 5]] = 2.0
    assert greedy(x) == (3, 0.0)
    x[3] = 1.0  # the runner-up tie (5 and 7) gives a zero margin either way
    assert greedy(x) == (5, 0.0)
    y = np.array([1.0, 4.0, 3.0, 3.0], dtype=np.float32)
    assert greedy(y) == (1, 1.0)


def test_edges_of_the_vocabulary() -> None:
    assert greedy(np.array([5.0, 1.0, 2.0], dtype=np.float32)) == (0, 3.0)
    assert greedy(np.array([1.0, 2.0, 5.0], dtype=np.float32)) == (2, 3.0)
    assert greedy(np.array([1.0], dtype=np.float32)) == (0, float("inf"))
