"""The step in the priority of a lane's loads: relative to the lane's own clock with lanes."""

from __future__ import annotations

from types import SimpleNamespace

from bevy_gguf.engine.runners.layers import RELATIVE_BASE, _Lane


def step(progress: int, clock: int, lanes: int = 2, lane_clock: str = "relative") -> int:
    lane = SimpleNamespace(lanes=lanes, runner=SimpleNamespace(lane_clock=lane_clock), _clock=clock)
    return _Lane._priority_step(lane, progress)  # type: ignore[arg-type]


def test_lanes_whose_clocks_stand_apart_tie_on_their_lagging_tokens() -> None:
    # lane A's clock at 57, lane B's at 63: their lagging tokens go by layer, not by clock
    assert step(57, 57) == step(63, 63) == RELATIVE_BASE
    # a key is (step << 32) | (layer + 1) << 16: B's layer 2 now goes before A's layer 5
    assert (step(63, 63) << 32) | (3 << 16) < (step(57, 57) << 32) | (6 << 16)


def test_within_a_lane_lagging_first_is_kept() -> None:
    assert step(58, 57) == RELATIVE_BASE + 1  # a token a step past the lane's clock comes after
    assert step(55, 57) == RELATIVE_BASE - 2  # one behind the clock (a prompt's wave's tokens) before


def test_one_lane_and_own_clocks_keep_the_progress() -> None:
    assert step(57, 40, lanes=1) == 57
    assert step(57, 40, lane_clock="own") == 57
