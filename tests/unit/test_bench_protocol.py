"""The bench protocol: the bound (the larger of the compute and link times, none without a compute
time) and the order of the systems in each repeat."""

from __future__ import annotations

import pytest

from bevy_gguf.bench.harness import BOUND_PASSED, _bound_tok_per_s, rate_against_bounds


def test_the_bound_is_set_by_the_slower_of_compute_and_link() -> None:
    assert _bound_tok_per_s(512, 2.0, 1.0) == pytest.approx(256)
    assert _bound_tok_per_s(512, 1.0, 4.0) == pytest.approx(128)
    assert _bound_tok_per_s(512, 2.0, None) == pytest.approx(256)


def test_no_compute_time_means_no_bound() -> None:
    # a sweep without stock-resident and without a 100% point: the link time alone is no bound
    assert _bound_tok_per_s(512, None, 0.1) is None



def test_a_bound_that_a_row_ran_faster_than_is_noted_at_its_point_only() -> None:
    # a link sweep without a 100% point: stock-resident's compute side, slower than bevy's lanes
    bound = [{"cache": 50.0, "link_point": link, "tok_per_s": 100.0} for link in ("slow", "fast")]
    rows = [{"system": "stock-resident", "cache": 100.0, "link_point": None, "tok_per_s": 100.0},
            {"system": "bevy", "cache": 50.0, "link_point": "slow", "tok_per_s": 63.0},
            {"system": "blocking", "cache": 50.0, "link_point": "slow", "tok_per_s": 50.0},
            {"system": "bevy", "cache": 50.0, "link_point": "fast", "tok_per_s": 107.0},
            {"system": "blocking", "cache": 50.0, "link_point": "fast", "tok_per_s": 90.0}]
    rate_against_bounds(rows, bound)
    assert [r["pct_of_bound"] for r in rows] == [None, 0.63, 0.5, 1.07, 0.9]
    assert "note" not in bound[0] and bound[1]["note"] == BOUND_PASSED
    bound = [{"cache": 50.0, "link_point": "fast", "tok_per_s": 107.0}]
    rate_against_bounds(rows[3:], bound)  # at the bound: no note
    assert "note" not in bound[0]


def test_each_repeat_runs_the_systems_in_an_order_rotated_by_one() -> None:
    from bevy_gguf.bench.harness import rotated

    systems = ["blocking", "prefetch", "bevy"]
    orders = [rotated(systems, r) for r in range(4)]
    assert orders == [systems, ["prefetch", "bevy", "blocking"], ["bevy", "blocking", "prefetch"], systems]
    assert all(sorted(o) == sorted(systems) for o in orders)
    assert rotated([], 2) == []


def test_stock_offload_runs_without_repacking_under_a_cap_from_stock_without_it(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """Repacking copies repackable weights out of the mapping at load, so a repacking stock under a
    cap is resident whatever the cap: stock-offload runs --no-repack, its cap from such a run."""
    from types import SimpleNamespace

    from bevy_gguf.bench import harness

    specs: list[tuple[dict, object]] = []

    class Cap:
        available, version, reason = True, 2, ""

        def __init__(self, limit: int) -> None:
            self.limit = limit

        def close(self) -> None: ...

    monkeypatch.setattr(harness, "MemoryCap", Cap)
    monkeypatch.setattr(harness, "evict_page_cache", lambda path: None)
    monkeypatch.setattr(harness, "run_worker", lambda spec, cap=None: specs.append((spec, cap)) or {"ok": 1})
    cfg = harness.BenchConfig(model=tmp_path / "m.gguf", systems=["stock-offload", "bevy"])
    info = SimpleNamespace(expert_bytes=1000)
    notes: dict[tuple[str, float], str] = {}
    for system in ("stock-offload", "llama-server-offload"):  # stock's server under the same rule
        harness._run_offload(cfg, info, system, 25.0, [{"peak_rss_bytes": 3000}, {"peak_rss_bytes": 2500}], notes)
    for (spec, cap), system in zip(specs, ("stock-offload", "llama-server-offload"), strict=True):
        assert spec["system"] == system and spec["repack"] is False
        assert cap.limit == 3000 - 1000 + 250 and "--no-repack" in notes[(system, 25.0)]


def test_the_bound_replays_each_slot_class_on_its_own_layers() -> None:
    """Two classes (down 144 B in layers 0-1, 210 B in 2-3) of 2 slots each: each class's misses
    are those of its layers' visits through its slots, priced at its own bytes."""
    from bevy_gguf.bench.harness import belady_misses, class_misses
    from bevy_gguf.engine.cache_layout import CacheLayout
    from tests.unit.test_cache_layout import info

    layout = CacheLayout.of(info([144, 144, 210, 210], n_expert=4, top_k=2))
    order = {"prefill": [], "decode": [(il, [0, 1]) for _ in range(2) for il in range(4)]}
    budget = 2 * layout.classes[0].bytes + 2 * layout.classes[1].bytes  # 2 slots each
    seen: list[tuple[list, int]] = []

    def count(sub: dict, n_slots: int) -> int:
        seen.append(([v[0] for v in sub["decode"]], n_slots))
        return belady_misses(sub, n_slots)

    misses, nbytes = class_misses(order, layout, budget, count)
    assert seen == [([0, 1, 0, 1], 2), ([2, 3, 2, 3], 2)]
    # the sum of each class replayed alone, each priced at its own expert bytes
    m0, m1 = (belady_misses({"prefill": [], "decode": [(il, [0, 1]) for _ in range(2) for il in ls]}, 2)
              for ls in ((0, 1), (2, 3)))
    assert (misses, nbytes) == (m0 + m1, m0 * 344 + m1 * 410)


def test_a_visit_wider_than_the_cache_is_split_as_a_micro_batched_call_would_be() -> None:
    from bevy_gguf.analysis.replay import belady_hits, fit_visits

    visits = [(0, [1, 2, 3, 4, 5]), (1, [])]
    assert fit_visits(visits, 2) == [(0, [1, 2]), (0, [3, 4]), (0, [5]), (1, [])]
    assert belady_hits(fit_visits(visits, 2), 2) == 0  # replayable where the whole visit is not
