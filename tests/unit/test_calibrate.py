"""The lane count is measured: the rule that reads the measurement, and what the cache allows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bevy_gguf.engine import calibrate


def cache(n_slots: int, n_layer: int = 8, n_expert: int = 64, top_k: int = 8) -> SimpleNamespace:
    return SimpleNamespace(n_slots=n_slots, layout=SimpleNamespace(n_layer=n_layer, n_expert=n_expert, top_k=top_k))


def test_a_whole_step_when_the_cache_holds_it_one_layer_when_it_holds_that_twice_else_none() -> None:
    assert calibrate.calibration_layers(cache(512), n_seq=8) == 8   # 8 layers x 64 experts
    assert calibrate.calibration_layers(cache(511), n_seq=8) == 1
    assert calibrate.calibration_layers(cache(128), n_seq=8) == 1   # 2 x 64
    assert calibrate.calibration_layers(cache(127), n_seq=8) == 0
    assert calibrate.calibration_layers(cache(32), n_seq=2) == 1    # 2 tokens: at most 16 experts a layer


@pytest.mark.parametrize("one,two,chosen", [(10.0, 8.0, 2), (10.0, 9.4, 1), (10.0, 12.0, 1)])
def test_more_lanes_only_when_clearly_faster(monkeypatch: pytest.MonkeyPatch, one: float, two: float,
                                             chosen: int) -> None:
    monkeypatch.setattr(calibrate, "time_lanes", lambda m, c, p, lanes, n, layers: {1: one, 2: two}[lanes])
    got, seconds = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), [1, 2])
    assert got == chosen and seconds == {1: one, 2: two}
