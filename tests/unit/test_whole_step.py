"""When a lane's step runs as one whole call outside the plan (_Lane._whole_step)."""

from __future__ import annotations

from types import SimpleNamespace

from bevy_gguf.engine.plan import FIRST
from bevy_gguf.engine.runners.layers import _Lane

LAYERS = [0, 1, 2, 3]


def lane(miss_rates: list[float], mode: str = "rare-misses", runahead: bool = False,
         all_in: set[int] | None = None, max_tokens: int = 8) -> SimpleNamespace:
    ln = SimpleNamespace(policy=SimpleNamespace(max_tokens=max_tokens), _all_in=all_in,
                         cache=SimpleNamespace(layout=SimpleNamespace(moe_layers=LAYERS, top_k=2)),
                         runner=SimpleNamespace(resident_steps=mode), runahead=SimpleNamespace(on=runahead),
                         _distinct_share=1.0, miss_rate=miss_rates)
    ln._nothing_to_share = lambda flights: _Lane._nothing_to_share(ln, flights)  # type: ignore[arg-type]
    return ln


def tokens(n: int, **kw: object) -> list[SimpleNamespace]:
    return [SimpleNamespace(**({"layer": FIRST, "prefill": False} | kw)) for _ in range(n)]


def whole(ln: SimpleNamespace, flights: list[SimpleNamespace]) -> bool:
    return _Lane._whole_step(ln, flights)  # type: ignore[arg-type]


def test_a_step_expected_to_miss_under_one_expert_runs_whole() -> None:
    # 4 tokens x top-2 x every selection distinct x 0.04 summed over the layers: 0.32 misses
    assert whole(lane([0.01] * 4), tokens(4))
    # 1.6 misses: the plan decides
    assert not whole(lane([0.05] * 4), tokens(4))


def test_all_in_runs_whole_only_where_every_expert_is_in() -> None:
    assert not whole(lane([0.01] * 4, mode="all-in"), tokens(4))
    assert whole(lane([0.5] * 4, mode="all-in", all_in=set(LAYERS)), tokens(4))
    assert whole(lane([0.5] * 4, all_in=set(LAYERS)), tokens(4))
    assert not whole(lane([0.5] * 4, all_in={0, 1}), tokens(4))  # not every layer loaded yet


def test_runahead_prompts_and_tokens_mid_step_go_through_the_plan() -> None:
    assert not whole(lane([0.0] * 4, runahead=True), tokens(4))  # runahead may split the step
    assert not whole(lane([0.0] * 4), tokens(3) + tokens(1, prefill=True))
    assert not whole(lane([0.0] * 4), tokens(3) + tokens(1, layer=2))
    assert not whole(lane([0.0] * 4, max_tokens=2), tokens(4))  # more tokens than a call may pin


def test_a_whole_steps_lookups_reach_the_miss_rates() -> None:
    """A whole step runs no refresh (which snapshots the cache's per-layer counters): its lookups are
    noted from the cache itself, so the next pass's miss rates see them."""
    counts = {0: {"hits": 10, "misses": 2}, 1: {"hits": 7, "misses": 0}}
    buf = SimpleNamespace(hits=[0, 0, 0], misses=[0, 0, 0])
    ln = SimpleNamespace(_flights=buf, cache=SimpleNamespace(layout=SimpleNamespace(moe_layers=[0, 1]),
                                                             native=SimpleNamespace(counters=counts.__getitem__)))
    _Lane._note_lookups(ln)  # type: ignore[arg-type]
    assert (buf.hits, buf.misses) == ([10, 7, 0], [2, 0, 0])
