"""The serving engine: one runner serves a live queue of requests on a background thread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from bevy_gguf.api import Llama
from bevy_gguf.engine.batched import RunStats
from bevy_gguf.engine.expert_cache import hit_rate
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.schedulers import make_runner
from bevy_gguf.engine.source import LiveQueue
from bevy_gguf.llm import ContextParams


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
    at most n_parallel decode at once, the rest wait in arrival order in a bounded queue."""

    def __init__(self, llm: Llama, ctx_per_seq: int, max_queued: int) -> None:
        self.llm = llm
        self.ctx_per_seq = ctx_per_seq
        self.queue = LiveQueue(max_queued)
        self.running: set[int] = set()
        self.lock = threading.Lock()
        self.throughput = Throughput()
        self.started = time.monotonic()
        self.error: str | None = None
        flash = int(llm.llama.context_params.flash_attn_type)
        self.runner, micro_batch = make_runner(llm.scheduler, llm.model, llm.model_path, llm.cache, llm.n_parallel,
                                               llm.n_threads, ctx_per_seq, flash_attn_type=flash)
        per_context = llm.scheduler.runner == "contexts"
        n_seq = 1 if per_context else llm.n_parallel
        self.params = ContextParams(n_ctx=n_seq * ctx_per_seq, n_batch=ctx_per_seq, n_seq_max=n_seq,
                                    n_threads=1 if per_context else llm.n_threads,
                                    n_ubatch=min(micro_batch, ctx_per_seq), flash_attn_type=flash)
        self.thread = threading.Thread(target=self._serve, name="bevy-serve", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.stats: RunStats = self.runner.serve(self.queue, self.params)
        except Exception as e:  # noqa: BLE001 - reported by /health, never silently
            self.error = f"{type(e).__name__}: {e}"

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
            self.running.add(id(req))
        if not self.queue.put(req):
            with self.lock:
                self.running.discard(id(req))
            return False
        return True

    def metrics(self) -> dict[str, float]:
        c = self.llm.cache.counters()
        uptime = max(time.monotonic() - self.started, 1e-9)
        with self.lock:
            in_engine = len(self.running)
        queued = len(self.queue)
        return {
            "requests_running": max(in_engine - queued, 0),
            "requests_queued": queued,
            "tokens_generated_total": self.throughput.total,
            "tokens_per_second": self.throughput.rate(),
            "expert_cache_hit_rate": hit_rate(c),
            "expert_bytes_loaded_total": c["bytes_loaded"],
            "expert_stall_seconds_total": c["stall_ns"] / 1e9,
            "link_busy_seconds_total": c["link_busy_ns"] / 1e9,
            "link_utilization": c["link_busy_ns"] / 1e9 / uptime,
        }

    def shutdown(self) -> None:
        self.queue.close()
        self.thread.join(timeout=30)
