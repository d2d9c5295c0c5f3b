"""Live progress on a terminal: tokens per request, cache hit rate, link GB/s."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from bevy_gguf.engine.request import Request


class LiveProgress:
    """Redraws one status line every `interval` seconds while a run goes on (terminals only)."""

    def __init__(self, requests: list[Request], counters: Callable[[], dict[str, int]] | None = None,
                 stream: TextIO = sys.stderr, interval: float = 0.25) -> None:
        self.requests, self.counters, self.stream, self.interval = requests, counters, stream, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = (time.perf_counter(), self.counters()["bytes_loaded"] if counters else 0)

    def line(self) -> str:
        done = sum(r.finished for r in self.requests)
        counts = " ".join(str(len(r.tokens)) for r in self.requests[:12])
        more = " ..." if len(self.requests) > 12 else ""
        text = f"{done}/{len(self.requests)} done | tokens {counts}{more}"
        if self.counters:
            c = self.counters()
            now, loaded = time.perf_counter(), c["bytes_loaded"]
            rate = (loaded - self._last[1]) / max(now - self._last[0], 1e-9) / 1e9
            self._last = (now, loaded)
            looked = c["hits"] + c["misses"]
            text += f" | hit {c['hits'] / looked if looked else 0:.0%} | link {rate:.2f} GB/s"
        return text

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()

    def __enter__(self) -> LiveProgress:
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._loop, name="bevy-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()
