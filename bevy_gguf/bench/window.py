"""The steady-state window of a serving run, and what each system did inside it.

A closed-loop run (n_parallel in flight, the next request joining as one leaves) starts on a
cold cache and ends draining: the first requests fill the cache, the last ones run with fewer
in flight. The window is what lies between: from the finish of the `warmup`-th request to the
moment fewer than n_parallel remain (once every request has been admitted, the next finish
leaves a slot empty). Everything a serving row reports is counted inside it: decode outputs,
their gaps (TPOT), the TTFT of the requests admitted in it, and the cache's counters (sampled
while the run goes, read at the window's ends by linear interpolation).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bevy_gguf.errors import BevyError

SAMPLE_EVERY_S = 0.01  # the counter sampler's period


@dataclass(frozen=True, slots=True)
class Window:
    start: float  # perf_counter seconds
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def holds(self, t: float) -> bool:
        return self.start < t <= self.end


def steady_window(finish_times: list[float], n_parallel: int, warmup: int) -> Window:
    """From the warmup-th finish to the finish after which fewer than n_parallel are in flight
    (the (n - n_parallel + 1)-th of n: by then every request has been admitted)."""
    finishes = sorted(finish_times)
    n = len(finishes)
    if warmup < 1 or n - n_parallel < warmup:
        raise BevyError(f"a serving window needs more requests than --parallel ({n_parallel}) plus the warm-up "
                        f"({warmup}): {n} given; raise --requests")
    start, end = finishes[warmup - 1], finishes[n - n_parallel]
    if end <= start:
        raise BevyError("the serving window is empty (every request finished at once): raise --requests")
    return Window(start, end)


def window_outputs(request_times: list[list[float]], window: Window) -> tuple[int, list[float]]:
    """Decode outputs in the window (a request's first output is its prompt's, not counted) and
    the gaps between consecutive outputs that end in it (TPOT, ms)."""
    tokens, gaps = 0, []
    for times in request_times:
        for a, b in zip(times, times[1:]):
            if window.holds(b):
                tokens += 1
                gaps.append(1e3 * (b - a))
    return tokens, gaps


def window_ttft_by_request(admitted: list[float | None], first_output: list[float | None], window: Window
                           ) -> dict[int, float]:
    """Time to first token (admission to first output) of the requests admitted in the window,
    by request index: the stream's i-th request is the same text in every system's run, so two
    systems' TTFTs pair up request by request."""
    return {i: 1e3 * (f - a) for i, (a, f) in enumerate(zip(admitted, first_output))
            if a is not None and f is not None and window.holds(a)}


class CounterSampler:
    """Samples a counters() callable on a thread while a run goes (a context manager)."""

    def __init__(self, counters: Callable[[], dict[str, int]], every_s: float = SAMPLE_EVERY_S) -> None:
        self.counters, self.every_s = counters, every_s
        self.times: list[float] = []
        self.samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-counters", daemon=True)

    def _take(self) -> None:
        self.samples.append(self.counters())
        self.times.append(time.perf_counter())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def __enter__(self) -> CounterSampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def at(self, t: float) -> dict[str, float]:
        """Every counter at time t, interpolated between the samples around it."""
        return interpolate(self.times, self.samples, t)

    def between(self, window: Window) -> dict[str, float]:
        """What every counter gained inside the window."""
        a, b = self.at(window.start), self.at(window.end)
        return {k: b[k] - a[k] for k in b}


def interpolate(times: list[float], samples: list[dict[str, Any]], t: float) -> dict[str, float]:
    """Counters at time t from time-ordered samples, linearly between the two around it (the
    first or last sample outside them)."""
    if not samples:
        return {}
    i = bisect.bisect_left(times, t)
    if i == 0:
        return dict(samples[0])
    if i >= len(times):
        return dict(samples[-1])
    t0, t1 = times[i - 1], times[i]
    w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
    return {k: samples[i - 1][k] + w * (samples[i][k] - samples[i - 1][k]) for k in samples[i]}


def window_counters(sampler: CounterSampler, window: Window) -> dict[str, Any]:
    """A serving row's cache figures inside its window: the counters' gains, and the compute and
    link busy seconds they hold; and the bytes loaded over the whole run (every system of a
    stream does the same work in its whole run: the same prompts, the same decode tokens)."""
    counters = {k: round(v) for k, v in sampler.between(window).items()}
    whole = run_gain(sampler, "bytes_loaded")
    return {"decode_counters": counters, "compute_busy_s": counters.get("compute_busy_ns", 0) / 1e9,
            "compute_used_s": counters.get("compute_used_ns", 0) / 1e9,
            "link_busy_s": counters.get("link_busy_ns", 0) / 1e9, "run_bytes_loaded": whole}


def run_gain(sampler: CounterSampler, key: str) -> float | None:
    """What one counter gained from the sampler's first sample to its last (None: not sampled)."""
    if not sampler.samples or key not in sampler.samples[-1]:
        return None
    return sampler.samples[-1][key] - sampler.samples[0].get(key, 0)
