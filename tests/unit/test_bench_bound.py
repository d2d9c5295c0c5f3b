"""The bench's bound: the larger of the compute and link times, and none without a compute time."""

from __future__ import annotations

import pytest

from bevy_gguf.bench.harness import _bound_tok_per_s


def test_the_bound_is_set_by_the_slower_of_compute_and_link() -> None:
    assert _bound_tok_per_s(512, 2.0, 1.0) == pytest.approx(256)
    assert _bound_tok_per_s(512, 1.0, 4.0) == pytest.approx(128)
    assert _bound_tok_per_s(512, 2.0, None) == pytest.approx(256)


def test_no_compute_time_means_no_bound() -> None:
    # a sweep without stock-resident and without a 100% point: the link time alone is no bound
    assert _bound_tok_per_s(512, None, 0.1) is None

