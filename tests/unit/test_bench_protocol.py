"""The bench protocol: the bound (the larger of the compute and link times, none without a compute
time) and the order of the systems in each repeat."""

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



def test_each_repeat_runs_the_systems_in_an_order_rotated_by_one() -> None:
    from bevy_gguf.bench.harness import rotated

    systems = ["blocking", "prefetch", "bevy"]
    orders = [rotated(systems, r) for r in range(4)]
    assert orders == [systems, ["prefetch", "bevy", "blocking"], ["bevy", "blocking", "prefetch"], systems]
    assert all(sorted(o) == sorted(systems) for o in orders)
    assert rotated([], 2) == []
