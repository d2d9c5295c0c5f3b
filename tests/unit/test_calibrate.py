"""The lane count is measured: the rule that reads the measurement, and what the cache allows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bevy_gguf.engine import calibrate


def cache(n_slots: int, n_layer: int = 8, n_expert: int = 64, top_k: int = 8,
          classes: tuple[tuple[int, ...], ...] | None = None, class_slots: tuple[int, ...] | None = None
          ) -> SimpleNamespace:
    """A cache of one slot class (or of classes: their layers, and slots; a layer in none is dense)."""
    classes = classes or (tuple(range(n_layer)),)
    layer_class = [next((c for c, layers in enumerate(classes) if il in layers), -1) for il in range(n_layer)]
    layout = SimpleNamespace(n_layer=n_layer, n_expert=n_expert, top_k=top_k, layer_class=layer_class,
                             classes=[SimpleNamespace(layers=layers) for layers in classes],
                             moe_layers=tuple(il for il, c in enumerate(layer_class) if c >= 0),
                             min_slots=lambda tokens: min(n_expert, top_k * tokens))  # CacheLayout.min_slots
    return SimpleNamespace(n_slots=n_slots, class_slots=class_slots or (n_slots,), layout=layout)


def test_a_whole_step_when_the_cache_holds_it_one_layer_when_it_holds_that_twice_else_none() -> None:
    assert calibrate.calibration_layers(cache(512), n_seq=8) == 8   # 8 layers x 64 experts
    assert calibrate.calibration_layers(cache(511), n_seq=8) == 1
    assert calibrate.calibration_layers(cache(128), n_seq=8) == 1   # 2 x 64
    assert calibrate.calibration_layers(cache(127), n_seq=8) == 0
    assert calibrate.calibration_layers(cache(32), n_seq=2) == 1    # 2 tokens: at most 16 experts a layer
    dense_first = cache(128, classes=(tuple(range(1, 8)),))  # layer 0 dense: through layer 1
    assert calibrate.calibration_layers(dense_first, n_seq=8) == 2


def test_slot_classes_each_hold_their_layers_or_layer_0s_twice() -> None:
    two = ((0, 1, 2, 3), (4, 5, 6, 7))
    assert calibrate.calibration_layers(cache(512, classes=two, class_slots=(256, 256)), n_seq=8) == 8
    assert calibrate.calibration_layers(cache(511, classes=two, class_slots=(256, 255)), n_seq=8) == 1
    assert calibrate.calibration_layers(cache(300, classes=two, class_slots=(127, 173)), n_seq=8) == 0


@pytest.mark.parametrize("one,two,chosen", [(10.0, 8.0, 2), (10.0, 9.4, 2), (10.0, 9.7, 1), (10.0, 12.0, 1)])
def test_more_lanes_only_when_clearly_faster(monkeypatch: pytest.MonkeyPatch, one: float, two: float,
                                             chosen: int) -> None:
    monkeypatch.setattr(calibrate, "time_lanes", lambda m, c, p, lanes, n, layers: {1: one, 2: two}[lanes])
    monkeypatch.setattr(calibrate, "LANE_ROUNDS", 1)
    monkeypatch.setattr(calibrate, "LANE_SPAN_S", 0.0)
    got, seconds, _ = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), [1, 2])
    assert got == chosen and seconds == {1: one, 2: two}


def test_lane_runs_stop_at_the_most_or_once_the_budget_is_spent_after_the_fewest() -> None:
    most, fewest, budget = calibrate.LANE_REPEATS_MAX, calibrate.LANE_REPEATS_MIN, calibrate.LANE_BUDGET_S
    assert not calibrate.enough_lane_runs(most - 1, 0.0)
    assert calibrate.enough_lane_runs(most, 0.0)
    assert not calibrate.enough_lane_runs(fewest - 1, 10 * budget)  # long calls: still the fewest
    assert calibrate.enough_lane_runs(fewest, budget)
    assert not calibrate.enough_lane_runs(fewest, 0.5 * budget)


def test_a_hiccup_over_one_round_of_a_lane_count_is_not_its_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = {1: iter([10.0, 10.0]), 2: iter([20.0, 8.0])}  # two lanes' first round hit by a hiccup
    monkeypatch.setattr(calibrate, "LANE_ROUNDS", 2)
    monkeypatch.setattr(calibrate, "LANE_SPAN_S", 0.0)
    monkeypatch.setattr(calibrate, "time_lanes", lambda m, c, p, lanes, n, layers: next(timed[lanes]))
    got, seconds, _ = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), [1, 2])
    assert got == 2 and seconds == {1: 10.0, 2: 8.0}


def test_rounds_go_on_until_they_span_the_time_asked_at_least_the_fewest_at_most_the_most() -> None:
    fewest, most, span = calibrate.LANE_ROUNDS, calibrate.LANE_ROUNDS_MAX, calibrate.LANE_SPAN_S
    assert calibrate.more_lane_rounds(fewest - 1, 10 * span)  # the fewest, however long they took
    assert calibrate.more_lane_rounds(fewest, 0.5 * span)
    assert not calibrate.more_lane_rounds(fewest, span)
    assert not calibrate.more_lane_rounds(most, 0.0)


def test_a_slow_spell_over_the_first_rounds_of_every_count_is_outlasted(monkeypatch: pytest.MonkeyPatch) -> None:
    # every timing takes 0.25 s of a fake clock; the machine is slow for the first second (both
    # counts' first two rounds), where two lanes read 0.975 of one lane's time: one lane would win
    clock = [0.0]
    calls: list[int] = []

    def timed(m: object, c: object, p: object, lanes: int, n: int, layers: int) -> float:
        slow = clock[0] < 1.0
        clock[0] += 0.25
        calls.append(lanes)
        return {1: 4.0, 2: 3.9}[lanes] if slow else {1: 3.2, 2: 2.5}[lanes]

    monkeypatch.setattr(calibrate, "time_lanes", timed)
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: clock[0])
    got, seconds, _ = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), [1, 2])
    assert got == 2 and seconds == {1: 3.2, 2: 2.5}
    assert calls[:6] == [1, 2, 2, 1, 1, 2]  # rounds alternate which count goes first
    assert len(calls) == 2 * round(calibrate.LANE_SPAN_S / 0.5)  # until the rounds span LANE_SPAN_S


def test_where_a_step_does_not_fit_the_fastest_count_wins_without_the_margin() -> None:
    """Loads will come there, and lanes overlap them: a tie within the margin goes to the fastest."""
    seconds = {1: 14.19, 2: 13.61}  # measured: the mixtral shape at 50%, 4 of 6 layers timed
    assert calibrate.pick_lanes(seconds, [1, 2], step_fits=True) == 1
    assert calibrate.pick_lanes(seconds, [1, 2], step_fits=False) == 2
    assert calibrate.pick_lanes({1: 19.81, 2: 20.82}, [1, 2], step_fits=False) == 1
    assert calibrate.pick_lanes({1: 10.0, 2: 7.0, 4: 6.0, 8: 6.5}, [1, 2, 4, 8], step_fits=False) == 4


def test_the_layers_timed_decide_whether_a_step_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate, "LANE_ROUNDS", 1)
    monkeypatch.setattr(calibrate, "LANE_SPAN_S", 0.0)
    monkeypatch.setattr(calibrate, "time_lanes", lambda m, c, p, lanes, n, layers: {1: 10.0, 2: 9.7}[lanes])
    monkeypatch.setattr(calibrate, "resident_layers", lambda m, c, p: 6)  # 6 of 8 layers' experts fit
    got, _, layers = calibrate.choose_lanes(None, cache(511), SimpleNamespace(n_seq_max=8), [1, 2])
    assert (got, layers) == (2, 6)
    monkeypatch.setattr(calibrate, "resident_layers", lambda m, c, p: 8)
    got, _, layers = calibrate.choose_lanes(None, cache(511), SimpleNamespace(n_seq_max=8), [1, 2])
    assert (got, layers) == (1, 8)


def test_lane_counts_timed_double_from_one_up_to_the_most() -> None:
    assert calibrate.lane_candidates(1) == [1]
    assert calibrate.lane_candidates(2) == [1, 2]
    assert calibrate.lane_candidates(6) == [1, 2, 4, 6]
    assert calibrate.lane_candidates(8) == [1, 2, 4, 8]


def test_a_lane_count_between_is_chosen_where_it_is_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = {1: 10.0, 2: 7.0, 4: 6.0, 8: 6.5}  # 8 lanes beat one, but 4 beat them all
    monkeypatch.setattr(calibrate, "LANE_ROUNDS", 1)
    monkeypatch.setattr(calibrate, "LANE_SPAN_S", 0.0)
    monkeypatch.setattr(calibrate, "time_lanes", lambda m, c, p, lanes, n, layers: timed[lanes])
    got, _, _ = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), calibrate.lane_candidates(8))
    assert got == 4
    timed[4], timed[8] = 6.9, 6.8  # within the margin of 2 lanes' time: fewer lanes
    got, _, _ = calibrate.choose_lanes(None, cache(512), SimpleNamespace(n_seq_max=8), calibrate.lane_candidates(8))
    assert got == 2


def test_lanes_are_timed_by_the_tokens_per_second_they_put_through_together() -> None:
    # one lane of 8 tokens, 10 calls in a second: 80 tokens/s, 0.1 s per batch of 8
    assert calibrate.seconds_per_batch(8, [8], [(10, 1.0)]) == pytest.approx(0.1)
    # two lanes of 4, each at its own pace over its own span: 4*12/1.2 + 4*9/0.9 = 80 tokens/s
    assert calibrate.seconds_per_batch(8, [4, 4], [(12, 1.2), (9, 0.9)]) == pytest.approx(0.1)
    # a lane that finished no call adds nothing; none at all: never chosen
    assert calibrate.seconds_per_batch(8, [4, 4], [(10, 1.0), (0, 0.0)]) == pytest.approx(0.2)
    assert calibrate.seconds_per_batch(8, [4, 4], [None, (0, 0.0)]) == float("inf")
