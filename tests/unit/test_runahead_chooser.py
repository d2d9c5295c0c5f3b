"""Runahead on or off, chosen by the rates its epochs measure (engine/runahead.py)."""

from __future__ import annotations

from bevy_gguf.engine.runahead import EXPLORE_EVERY, MAX_STRETCH, RunaheadChooser


def drive(chooser: RunaheadChooser, seconds_per_epoch: dict[bool, float], epochs: int) -> list[bool]:
    """Run epochs of exactly epoch_work token-layers (in two calls) taking these seconds per mode,
    each after its warm-up (warm_work, one call of 10 s); the modes they ran in."""
    t = 0.0
    modes = []
    for _ in range(epochs):
        mode = chooser.on
        modes.append(mode)
        if chooser.warm_work:
            chooser.record(chooser.warm_work, t, t + 10.0)
            t += 10.0
        half = seconds_per_epoch[mode] / 2
        chooser.record(chooser.epoch_work // 2, t, t + half)
        chooser.record(chooser.epoch_work - chooser.epoch_work // 2, t + half, t + 2 * half)
        t += 2 * half
    return modes


def test_the_faster_mode_runs_after_a_warm_up_in_turn_the_slower_one_explored_now_and_then() -> None:
    chooser = RunaheadChooser(epoch_work=64, warm_work=32)
    modes = drive(chooser, {True: 1.0, False: 1.05}, 5 + 3 * EXPLORE_EVERY)  # 5% apart
    assert modes[:5] == [True, False, True, False, True]  # an unmeasured epoch, then the modes in turn
    later = modes[5:]
    assert later.count(False) == 3 and later.count(True) == len(later) - 3  # one in EXPLORE_EVERY
    assert chooser.rates[True] == 64.0 and round(chooser.rates[False], 6) == round(64 / 1.05, 6)
    chooser = RunaheadChooser(epoch_work=64)
    assert drive(chooser, {True: 1.05, False: 1.0}, 5 + EXPLORE_EVERY)[5:].count(False) == EXPLORE_EVERY - 1


def test_a_mode_measured_far_slower_is_tried_more_rarely() -> None:
    chooser = RunaheadChooser(epoch_work=64)
    later = drive(chooser, {True: 1.0, False: 2.0}, 5 + 2 * MAX_STRETCH * EXPLORE_EVERY)[5:]  # 2x apart
    assert later.count(False) == 2
    chooser = RunaheadChooser(epoch_work=64)
    later = drive(chooser, {True: 1.0, False: 1.2}, 5 + 4 * EXPLORE_EVERY + 2)[5:]  # 20% apart: half as often
    assert later.count(False) == 2


def test_a_change_of_the_machine_is_followed() -> None:
    chooser = RunaheadChooser(epoch_work=64)
    drive(chooser, {True: 1.0, False: 2.0}, 12)
    modes = drive(chooser, {True: 4.0, False: 2.0}, 3 * EXPLORE_EVERY)  # runahead became slower
    assert modes[-EXPLORE_EVERY // 2:] == [False] * (EXPLORE_EVERY // 2)


def test_forced_modes_never_change_and_idle_time_is_not_counted() -> None:
    for fixed in (True, False):
        chooser = RunaheadChooser(epoch_work=64, fixed=fixed)
        assert set(drive(chooser, {True: 1.0, False: 5.0}, 20)) == {fixed}
    chooser = RunaheadChooser(epoch_work=64)
    chooser.record(32, 0.0, 1.0)
    chooser.idle()  # the half epoch before the wait is dropped: the next epoch starts at its first call
    chooser.record(64, 100.0, 101.0)
    assert chooser.epochs == {True: 0, False: 0} and not chooser.on  # the first epoch is not measured
    chooser.record(64, 200.0, 202.0)
    assert chooser.rates == {False: 32.0}


def test_an_epochs_first_part_is_not_measured() -> None:
    chooser = RunaheadChooser(epoch_work=64, warm_work=32)
    drive(chooser, {True: 1.0, False: 1.0}, 1)  # the unmeasured first epoch
    chooser.record(32, 0.0, 50.0)   # the warm-up: 50 s the mode inherited from the other
    chooser.record(64, 50.0, 52.0)  # measured from its end
    assert chooser.rates == {False: 32.0}


def test_calls_of_prompt_chunks_only_are_left_out_of_the_measured_time() -> None:
    chooser = RunaheadChooser(epoch_work=64)
    drive(chooser, {True: 1.0, False: 1.0}, 1)  # the unmeasured first epoch
    chooser.record(32, 0.0, 1.0)
    chooser.exclude(5.0)  # a prefill call between two decode calls
    chooser.record(32, 6.0, 7.0)
    assert chooser.rates == {False: 32.0}  # 64 token-layers in 7 - 5 seconds
