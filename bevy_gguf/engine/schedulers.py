"""Schedulers are policies over two runners: adding one touches no runner.

| scheduler | runner | policy |
|---|---|---|
| blocking | batched: one context, every running sequence per step | stall on every miss (stock's behaviour) |
| prefetch | batched | blocking + load the experts layer il+1's router predicts from layer il's input |
| bevy-ctx | contexts: one per request, on its thread | runahead: blocked ones wait, others compute, lagging first |
| bevy | layers: one context, layer-range calls | self-balancing: ready requests grouped per layer, lagging first |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bevy_gguf.engine.batched import BatchedRunner, RunStats
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.engine.layerwise import SelfBalancingRunner
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.runahead import ContextRunner
from bevy_gguf.errors import BevyError
from bevy_gguf.llm import Context, Model


class Runner(Protocol):
    def run(self, requests: list[Request]) -> RunStats: ...


@dataclass(frozen=True, slots=True)
class Scheduler:
    name: str
    runner: str            # "batched", "contexts" or "layers"
    prefetch: bool = False


SCHEDULERS = {
    "blocking": Scheduler("blocking", "batched"),
    "prefetch": Scheduler("prefetch", "batched", prefetch=True),
    "bevy-ctx": Scheduler("bevy-ctx", "contexts"),
    "bevy": Scheduler("bevy", "layers"),
}


def get_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise BevyError(f"unknown scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]


def make_runner(scheduler: Scheduler, model: Model, model_path: Path, cache: ExpertCache, n_parallel: int,
                n_threads: int, prompt_limit: int, flash_attn_type: int = -1) -> tuple[Runner, int]:
    """The runner that carries out scheduler, and its micro-batch (tokens per graph)."""
    if scheduler.runner == "layers":
        runner = SelfBalancingRunner(model, cache, n_parallel, n_threads, flash_attn_type=flash_attn_type)
        return runner, cache.layout.micro_batch(cache.n_slots, prompt_limit)
    if scheduler.runner == "contexts":
        runner = ContextRunner(model, cache, n_parallel, n_threads, flash_attn_type=flash_attn_type)
        contexts = min(n_parallel, 1 << 30)
        return runner, cache.layout.micro_batch(cache.n_slots, prompt_limit, contexts=contexts)
    if scheduler.prefetch:
        cache.enable_prefetch(str(model_path))

    def attach(ctx: Context) -> None:
        cache.attach(ctx, prefetch=scheduler.prefetch)

    cache.set_concurrency(1)
    micro_batch = cache.layout.micro_batch(cache.n_slots, prompt_limit * n_parallel)
    return BatchedRunner(model, n_parallel, n_threads, on_context=attach, micro_batch=micro_batch,
                         counters=cache.counters, flash_attn_type=flash_attn_type,
                         around_decode=(cache.begin, cache.end)), micro_batch
