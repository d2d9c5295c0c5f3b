"""The server's view of the engine: submission with a bounded queue, and the /metrics numbers."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.stats import hit_rate

SHUTTING_DOWN = "the server is shutting down"  # why a request queued at a shutdown failed


@dataclass(slots=True)
class Throughput:
    """Generated tokens over a sliding window (for /metrics)."""

    window_s: float = 10.0
    stamps: list[float] = field(default_factory=list)
    total: int = 0

    def add(self) -> None:
        now = time.monotonic()
        self.stamps.append(now)
        self.total += 1
        cut = now - self.window_s
        while self.stamps and self.stamps[0] < cut:
            self.stamps.pop(0)

    def rate(self) -> float:
        now = time.monotonic()
        recent = [t for t in self.stamps if t >= now - self.window_s]
        return len(recent) / self.window_s


class ServingEngine:
    """Requests join the running set between steps and leave when done (continuous batching);
    at most n_parallel decode at once, the rest wait in arrival order in a bounded queue. The
    LLMEngine's serving loop runs them on its background thread."""

    def __init__(self, engine: LLMEngine, max_queued: int) -> None:
        self.engine = engine
        self.running: set[int] = set()
        self.lock = threading.Lock()
        self.throughput = Throughput()
        self.started = time.monotonic()
        self.draining = False  # a shutdown began: nothing new is taken
        engine.start(max_queued)

    @property
    def error(self) -> str | None:
        return self.engine.serve_error

    def submit(self, req: Request) -> bool:
        """Queue req (False: the queue is full). Its on_update runs on the engine's thread."""
        user = req.on_update

        def update(r: Request) -> None:
            if not r.finished:
                self.throughput.add()
            else:
                with self.lock:
                    self.running.discard(id(r))
            if user:
                user(r)

        req.on_update = update
        with self.lock:
            if self.draining:
                return False
            self.running.add(id(req))
        if not self.engine.add_request(req):
            with self.lock:
                self.running.discard(id(req))
            return False
        return True

    def metrics(self) -> dict[str, float]:
        c = self.engine.counters()
        uptime = max(time.monotonic() - self.started, 1e-9)
        with self.lock:
            in_engine = len(self.running)
        queued = self.engine.queued()
        return {
            "requests_running": max(in_engine - queued, 0),
            "requests_queued": queued,
            "tokens_generated_total": self.throughput.total,
            "tokens_per_second": self.throughput.rate(),
            "expert_cache_hit_rate": hit_rate(c),
            "expert_cache_hits_total": c.get("hits", 0),
            "expert_cache_misses_total": c.get("misses", 0),
            "expert_bytes_loaded_total": c["bytes_loaded"],
            "compute_busy_seconds_total": c.get("compute_busy_ns", 0) / 1e9,
            "compute_used_seconds_total": c.get("compute_used_ns", 0) / 1e9,
            "expert_stall_seconds_total": c["stall_ns"] / 1e9,
            "link_busy_seconds_total": c["link_busy_ns"] / 1e9,
            "link_utilization": c["link_busy_ns"] / 1e9 / uptime,
            "expert_slots_pinned": self.engine.cache.pinned() if self.engine.cache is not None else 0,
        }

    def drain(self) -> int:
        """A shutdown begins: no new requests; those still queued fail with SHUTTING_DOWN (their
        clients get 503); the running ones go on. Returns how many were queued."""
        with self.lock:
            self.draining = True
        queued = self.engine.close_queue()
        for req in queued:
            req.fail(SHUTTING_DOWN)
        return len(queued)

    def shutdown(self) -> None:
        self.engine.stop()
