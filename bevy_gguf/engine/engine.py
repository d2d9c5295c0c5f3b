"""The engine: one model, one expert cache and the runner of one EngineConfig.

Every caller (`bevy-gguf run`, the bench worker, `bevy_gguf.Llama`, the server, the tests'
probes) builds an EngineConfig and drives an LLMEngine:

    engine = LLMEngine(EngineConfig(model=path, scheduler="bevy", expert_cache="25%"))
    stats = engine.generate(requests)          # a fixed list, n_parallel at a time
    engine.start(max_queued=128)               # or serve a live queue on a background thread:
    engine.add_request(req); engine.abort(req)
    engine.close()
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Protocol

from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import ContextParams, Model
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.config import LOAD_MODES, EngineConfig
from bevy_gguf.engine.calibrate import StepCosts
from bevy_gguf.engine.device_slots import CPU_DEVICE, find_device
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.engine.registry import Scheduler, get_scheduler, runnable_scheduler
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.runners.batched import BatchedRunner
from bevy_gguf.engine.runners.contexts import ContextRunner
from bevy_gguf.engine.runners.layers import SelfBalancingRunner
from bevy_gguf.engine.source import LiveQueue, RequestSource
from bevy_gguf.engine.stats import RunStats
from bevy_gguf.gguf_info import ModelInfo, inspect_model


class Runner(Protocol):
    micro_batch: int | None

    def run(self, requests: list[Request]) -> RunStats: ...

    def serving_params(self, ctx_per_seq: int) -> ContextParams: ...

    def serve(self, source: RequestSource, params: ContextParams) -> RunStats: ...


# what the last runner measured and did, as cache_summary names it -> the runner's attribute
# (bevy's; None for the runners without it)
RUNNER_STATS = {"lanes": "lanes_used", "two_pass_overhead_s": "pass_overhead_s",
                "load_contention_s": "load_contention_s", "load_alone_s": "load_alone_s",
                "load_beside_s": "load_beside_s",
                "two_pass_calls": "two_pass_calls", "layer_calls": "calls", "resident_calls": "resident_calls",
                "wide_calls": "wide_calls", "permit_prompts": "permit_prompts", "permit_chunk": "permit_chunk",
                "calibration_error": "calibration_error", "lane_layers": "lane_layers",
                "runahead": "runahead_stats", "lane_time": "time_split"}


def experts_in_host_memory(config: EngineConfig, n_layer: int) -> int:
    """How many leading layers keep their routed expert tensors in host memory (llama.cpp's
    --n-cpu-moe): the stock engine, as asked; the bevy engine, every layer once any is on a GPU
    (-ngl), so that the model's own expert tensors stay mapped and unread (lazy experts) instead
    of being uploaded to the GPU beside the cache, which is the only place its matmuls read them."""
    if config.engine == "stock":
        return min(config.n_cpu_moe, n_layer)
    return n_layer if config.gpu_layers > 0 else 0


class LLMEngine:
    """Owns the model, the expert cache (the bevy engine only) and makes the runners."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.info: ModelInfo = inspect_model(config.model)
        self.stock = config.engine == "stock"
        # the scheduler that runs, and why it is not the one asked for (None: it is)
        self.scheduler: Scheduler
        self.scheduler_note: str | None
        self.scheduler, self.scheduler_note = ((get_scheduler(config.scheduler), None) if self.stock
                                               else runnable_scheduler(config.scheduler, self.info.arch))
        if self.scheduler_note:
            print(f"bevy-gguf: {self.scheduler_note}", file=sys.stderr)
        self.lib = use_libllama("stock" if self.stock else "patched")
        if not self.stock:
            llama_ext.set_lazy_experts(self.lib, True)  # routed experts are resident only in the cache
        # where the cache's slots live, and whether its matmuls can run two passes (a CPU's)
        self.device = None if self.stock or config.device is None else find_device(
            llama_ext.devices(self.lib), config.device, config.gpu_layers)
        self.model = Model(self.lib, config.model, repack=config.repack, gpu_layers=config.gpu_layers,
                           cpu_moe_layers=experts_in_host_memory(config, self.info.n_layer),
                           load_mode=LOAD_MODES[config.load_mode])
        self.cache: ExpertCache | None = None
        self.fill_s = 0.0  # start-up seconds loading every expert (a cache that holds them all)
        try:
            if not self.stock:
                self.cache = ExpertCache(self.info, config.expert_cache, config.link_spec,
                                         policy=config.eviction, n_workers=config.link_workers,
                                         wait_timeout_s=config.wait_timeout_s, seed=config.seed,
                                         repack=self.lib if config.repack else None,
                                         device=self.device[0] if self.device else None, lib=self.lib)
                self.fill_s = self.cache.fill()  # a cache that holds every expert loads them now
        except BaseException:
            self.model.close()
            raise
        self.runner: Runner | None = None  # the last one made
        self._lane_memo: dict[tuple[int, int], int] = {}  # bevy's lane counts measured on this machine
        self._pass_memo: dict[tuple[int, int], StepCosts | None] = {}  # and what overlapping costs it
        self._queue: LiveQueue | None = None
        self._thread: threading.Thread | None = None
        self.serve_stats: RunStats | None = None
        self.serve_error: str | None = None

    # -- runners -------------------------------------------------------------------------

    def make_runner(self, n_parallel: int | None = None) -> Runner:
        """The scheduler's runner for n_parallel sequences at once (default: the config's)."""
        cfg, n = self.config, n_parallel or self.config.n_parallel
        flash = cfg.flash_attn_type
        two_pass = self.scheduler.two_pass if cfg.two_pass == "auto" else cfg.two_pass == "on"
        if self.device and self.device[1] != CPU_DEVICE:
            two_pass = False  # a GPU's mul_mat_id cannot leave rows out: patch 0008 computes one pass there
        if self.cache is None:
            runner: Runner = BatchedRunner(self.model, n, cfg.n_threads, flash, kv_unified=cfg.kv_unified)
        elif self.scheduler.runner == "layers":
            runner = SelfBalancingRunner(self.model, self.cache, n, cfg.n_threads, flash_attn_type=flash,
                                         wait_timeout_s=cfg.wait_timeout_s, lanes=cfg.lanes,
                                         split_factor=cfg.split_factor, load_budget=cfg.load_budget,
                                         lane_memo=self._lane_memo,
                                         two_pass=two_pass, pass_memo=self._pass_memo, runahead=cfg.runahead,
                                         prefill_wave=cfg.prefill_wave, prefill_first=cfg.prefill_first,
                                         kv_unified=cfg.kv_unified, wide_prefill=cfg.wide_prefill,
                                         lane_clock=cfg.lane_clock, resident_steps=cfg.resident_steps)
        elif self.scheduler.runner == "contexts":
            runner = ContextRunner(self.model, self.cache, n, cfg.n_threads, flash_attn_type=flash, two_pass=two_pass)
        else:
            runner = BatchedRunner(self.model, n, cfg.n_threads, flash, cache=self.cache,
                                   prefetch=self.scheduler.prefetch, two_pass=two_pass, kv_unified=cfg.kv_unified)
        self.runner = runner
        return runner

    def generate(self, requests: list[Request], runner: Runner | None = None) -> RunStats:
        """Decode a fixed list of requests, n_parallel at a time (the runner: one made for them)."""
        if not requests:
            return RunStats()
        runner = runner or self.make_runner(min(self.config.n_parallel, len(requests)))
        try:
            return runner.run(requests)
        finally:
            if self.cache is not None:
                self.cache.release_hooks()

    # -- serving -------------------------------------------------------------------------

    def start(self, max_queued: int) -> None:
        """Serve a live queue on a background thread: n_parallel sequences of n_ctx tokens."""
        if self._thread is not None:
            return
        ctx_per_seq = self.config.n_ctx or 2048
        runner = self.make_runner()
        params = runner.serving_params(ctx_per_seq)
        self._queue = LiveQueue(max_queued)

        def serve() -> None:
            try:
                self.serve_stats = runner.serve(self._queue, params)
            except Exception as e:  # noqa: BLE001 - reported by serve_error (the server's /health)
                self.serve_error = f"{type(e).__name__}: {e}"
                for req in self._queue.close_and_take_unfinished():  # nobody decodes them now: answer them
                    req.fail(f"the serving loop stopped: {self.serve_error}")

        self._thread = threading.Thread(target=serve, name="bevy-serve", daemon=True)
        self._thread.start()

    def add_request(self, req: Request) -> bool:
        """Queue req for the serving loop (False: the queue is full or closed)."""
        if self._queue is None:
            raise RuntimeError("add_request needs start() first")
        return self._queue.put(req)

    @staticmethod
    def abort(req: Request) -> None:
        """Cancel req: the runner drops it at its next step (its KV cells and pins are freed)."""
        req.cancelled = True

    def queued(self) -> int:
        return len(self._queue) if self._queue is not None else 0

    def close_queue(self) -> list[Request]:
        """No more requests; returns those that were still queued (none of them started)."""
        return self._queue.close_and_take() if self._queue is not None else []

    def stop(self, timeout_s: float = 30.0) -> None:
        """No more requests: the serving loop drains the queue, then ends."""
        if self._queue is not None:
            self._queue.close()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    # -- state ---------------------------------------------------------------------------

    def counters(self, il: int = -1) -> dict[str, int]:
        """The expert cache's counters (of layer il, or totals); {} on the stock engine."""
        return self.cache.counters(il) if self.cache is not None else {}

    def cache_summary(self, stats: RunStats, events: bool = False) -> dict[str, Any] | None:
        """The expert cache of the last run: size, link, micro-batch, counters (None on stock)."""
        if self.cache is None:
            return None
        c = self.cache
        models = getattr(self.runner, "cost_models", [])
        return {"scheduler": self.scheduler.name, "scheduler_note": self.scheduler_note,
                "link": c.link_name, "store": c.store, "staging_pinned": c.staging_pinned(),
                "bytes": c.budget_bytes, "slots": c.n_slots,
                "class_slots": list(c.class_slots), "wasted_bytes": c.wasted_bytes, "fill_s": self.fill_s,
                "repacked": len(c.repacked), "expert_tensors": len(self.info.expert_tensors),
                "micro_batch": self.runner.micro_batch if self.runner else None, "decode": stats.decode_counters,
                "total": c.counters(), "layers": [c.counters(il) for il in range(self.info.n_layer)],
                "events": c.events() if events else [], "load_s": c.load_s(),
                "cost_model": [m.as_dict() for m in models],
                "lane_seconds": getattr(self.runner, "lane_seconds", {})} | {
                key: getattr(self.runner, attr, None) for key, attr in RUNNER_STATS.items()}

    def close(self) -> None:
        """Stop serving, then free the cache (and its hooks) and the model, in that order."""
        self.stop()
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        self.model.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
