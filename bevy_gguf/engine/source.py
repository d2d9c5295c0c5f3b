"""Where a runner takes its requests from: a fixed list (`run`) or a live queue (`serve`)."""

from __future__ import annotations

import threading
import time
from collections import deque

from bevy_gguf.engine.request import Request


class RequestSource:
    """A runner admits requests from here between steps, in arrival order."""

    finite = False  # all requests known up front (a run): runners may keep per-call history

    def take(self, n: int) -> list[Request]:
        """Up to n waiting requests, without blocking."""
        raise NotImplementedError

    def idle_wait(self) -> bool:
        """Nothing is in flight: block until a request arrives; False once no more will come."""
        raise NotImplementedError


class FixedSource(RequestSource):
    """The requests of one `run`: all there from the start, no more after."""

    finite = True

    def __init__(self, requests: list[Request]) -> None:
        self._left = deque(requests)

    def take(self, n: int) -> list[Request]:
        return _admitted([self._left.popleft() for _ in range(min(n, len(self._left)))])

    def idle_wait(self) -> bool:
        return bool(self._left)


class LiveQueue(RequestSource):
    """A bounded FIFO that a server fills while a runner serves it (thread-safe)."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self._q: deque[Request] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._taken: list[Request] = []  # handed to the runner and not finished when last looked at

    def put(self, req: Request) -> bool:
        """Queue req; False when the queue is full (or closed)."""
        with self._cv:
            if self._closed or len(self._q) >= self.max_queued:
                return False
            self._q.append(req)
            self._cv.notify()
            return True

    def take(self, n: int) -> list[Request]:
        with self._cv:
            taken = _admitted([self._q.popleft() for _ in range(min(n, len(self._q)))])
            if taken:  # at most the runner's in-flight requests stay listed
                self._taken = [r for r in self._taken if not r.finished] + taken
            return taken

    def idle_wait(self) -> bool:
        with self._cv:
            self._cv.wait_for(lambda: self._q or self._closed)
            return bool(self._q)

    def __len__(self) -> int:
        with self._cv:
            return len(self._q)

    def close(self) -> None:
        """No more requests: the runner stops once the queue is drained."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def close_and_take_unfinished(self) -> list[Request]:
        """The runner stopped: no more requests; returns every unfinished one, queued or taken."""
        left = self.close_and_take()
        with self._cv:
            taken, self._taken = [r for r in self._taken if not r.finished], []
        return taken + left

    def close_and_take(self) -> list[Request]:
        """No more requests, and those still waiting leave the queue (a shutdown answers them)."""
        with self._cv:
            self._closed = True
            left, self._q = list(self._q), deque()
            self._cv.notify_all()
            return left


def _admitted(requests: list[Request]) -> list[Request]:
    """Stamp the requests a runner takes with the time it took them."""
    now = time.perf_counter()
    for r in requests:
        r.admitted_s = now
    return requests
