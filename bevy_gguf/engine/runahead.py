"""Runahead on or off: whichever decodes faster on this machine, measured while it decodes.

Runahead (the flights whose experts are in run on while the others' load) hides link time
behind compute, and it costs calls: a group split in two pays a call's fixed cost twice and
reads its shared weights twice, and the flights left behind later run their layers alone. Which
wins depends on the machine (its compute against its link) and on the moment (the cache's hit
rate, the contexts' lengths), and a prediction of it from the call cost model went wrong both
ways (measured on the default model at a 25% cache: a lane whose groups stayed whole kept them
whole, 0.94x blocking, and one whose groups had split stayed split, 1.27x: the model fitted
on merged calls priced a stop above the stalls it would hide). So each lane measures it: it
decodes in epochs, in turn with runahead (groups split where a layer's expected stall is above
a call's cost) and without (groups kept whole: one call per step as in blocking, its MoE layers
in two passes where they pay), keeps each mode's recent rate (decode token-layers per second of
wall time, stalls included; calls of prompt chunks alone are left out: their token-layers are
far cheaper and come at random), then runs the faster one and tries the other every
`explore_every` epochs (up to 4x as rarely where it measured far slower: a gap of 10% or less,
every 8; of 40% or more, every 32), so that a change (a warmer cache, longer contexts, other
load on the machine) is seen. Without misses both modes run the same calls, so nothing is lost
where there is nothing to hide; where runahead loses, what is lost is the explored epochs.

An epoch's first part is not measured (`warm_work`, a step's work): a mode inherits the
flights as the other left them. Runahead leaves flights spread over up to a token's layers,
those ahead having computed what was resident and those behind still owing what loads; the
epoch after it, without runahead, pays that debt while it regroups. Measured from the first
call, runahead's epochs were credited with work the next epoch paid for (on the default model
at a 25% cache: 0.7k token-layers/s against 0.5k without, while the two modes run alone decoded
at the same speed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

EXPLORE_EVERY = 8   # epochs: one in this many runs the mode that measured slower (at most 10% slower) ...
GAP_STEP = 0.1      # ... and one in EXPLORE_EVERY x (gap / GAP_STEP) where it measured slower by a larger gap,
MAX_STRETCH = 4     # ... up to this many times as rarely
WARMUP = 4          # measured epochs at start, the modes in turn (after one unmeasured epoch: a cold cache)
RATE_DECAY = 0.5    # an epoch moves its mode's rate this share of the way


@dataclass(slots=True)
class RunaheadChooser:
    """Which mode the lane runs now (`on`), from the rates its epochs measured."""

    epoch_work: int                 # token-layers measured per epoch (about two steps of the lane's sequences)
    warm_work: int = 0              # token-layers before the measured part (a step's: the mode settles)
    fixed: bool | None = None       # runahead forced on (True) or off (False); None: measured
    explore_every: int = EXPLORE_EVERY
    rates: dict[bool, float] = field(default_factory=dict)  # mode -> token-layers per second, lately
    epochs: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # measured, per mode
    _epoch: int = 0                 # epochs ended
    _since_explore: int = 0
    _start: float | None = None     # when the epoch's measured part began (None: at its first call)
    _work: int = 0                  # ... token-layers computed in it
    _warm: int = 0                  # token-layers of the epoch before it
    on: bool = True

    def __post_init__(self) -> None:
        if self.fixed is not None:
            self.on = self.fixed

    def record(self, work: int, start: float, end: float | None = None) -> None:
        """A call from start to end (default: now) computed `work` token-layers."""
        if self._warm < self.warm_work:  # the mode settles: not measured
            self._warm += work
            if self._warm >= self.warm_work:
                self._start = time.perf_counter() if end is None else end
            return
        if self._start is None:
            self._start = start
        self._work += work
        if self._work >= self.epoch_work:
            self._end_epoch(time.perf_counter() if end is None else end)

    def exclude(self, seconds: float) -> None:
        """A call that decoded nothing (prompt chunks only) took this long: not the mode's time."""
        if self._start is not None:
            self._start += seconds

    def idle(self) -> None:
        """Nothing to decode: the epoch under way is dropped (an idle wait is not a mode's time)."""
        self._start, self._work, self._warm = None, 0, 0

    def _end_epoch(self, now: float) -> None:
        elapsed = now - (self._start or now)
        measured = self._epoch > 0 and elapsed > 0  # the first epoch starts on a cold cache
        if measured:
            rate = self._work / elapsed
            old = self.rates.get(self.on)
            self.rates[self.on] = rate if old is None else old + RATE_DECAY * (rate - old)
            self.epochs[self.on] += 1
        self._epoch += 1
        self._start, self._work, self._warm = None, 0, 0
        if self.fixed is None:
            self.on = self._next_mode()

    def _next_mode(self) -> bool:
        if len(self.rates) < 2 or min(self.epochs.values()) < WARMUP // 2:
            return not self.on  # warm-up: in turn
        best = self.rates[True] >= self.rates[False]
        gap = self.rates[best] / max(self.rates[not best], 1e-30) - 1.0
        stretch = min(MAX_STRETCH, max(1.0, gap / GAP_STEP))
        self._since_explore += 1
        if self._since_explore >= self.explore_every * stretch:
            self._since_explore = 0
            return not best
        return best

    def as_dict(self) -> dict[str, float | int | None]:
        """Each mode's measured rate (token-layers per second) and epochs, for stats."""
        return {"runahead_rate": self.rates.get(True), "whole_rate": self.rates.get(False),
                "runahead_epochs": self.epochs[True], "whole_epochs": self.epochs[False]}
