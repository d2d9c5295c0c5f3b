"""The batched runner: one llama context, all running sequences decoded together each step.

This is what llama-server does with `--parallel N` (and what `--engine stock` means, §3):
up to N requests run at once, each on its own sequence id; a step first prefills the prompts of
newly admitted requests in one batch, then decodes one token of every running request in one
batch. With N = 1 the prompts are decoded one at a time. The schedule depends only on the
requests, so every engine that uses this runner sees the same batches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bevy_gguf.engine.request import MULTIBYTE_SLACK, Request
from bevy_gguf.engine.source import FixedSource, RequestSource
from bevy_gguf.llm import Context, ContextParams, Model


@dataclass(slots=True)
class BatchCall:
    """One llama_decode: which request each batch row belongs to, and whether it was prefill."""

    prefill: bool
    rows: list[int]  # index into the request list, per batch row


@dataclass(slots=True)
class RunStats:
    decode_s: float = 0.0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    calls: list[BatchCall] = field(default_factory=list)
    decode_counters: dict[str, float] = field(default_factory=dict)  # expert cache, decode calls only

    @property
    def tok_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def context_params(requests: list[Request], n_parallel: int, n_threads: int,
                   micro_batch: int | None = None, flash_attn_type: int = -1) -> ContextParams:
    """A context that fits any n_parallel of the requests at once; graphs of at most
    micro_batch tokens (None: a whole batch per graph)."""
    longest = max(len(r.prompt_tokens) + r.n_steps + 1 + MULTIBYTE_SLACK for r in requests)
    prompts = sorted((len(r.prompt_tokens) for r in requests), reverse=True)
    n_batch = max(sum(prompts[:n_parallel]), n_parallel, 32)
    n_ubatch = min(micro_batch, n_batch) if micro_batch else None
    return ContextParams(n_ctx=n_parallel * longest, n_batch=n_batch, n_seq_max=n_parallel, n_threads=n_threads,
                         n_ubatch=n_ubatch, flash_attn_type=flash_attn_type)


class BatchedRunner:
    """Decodes requests on one context, n_parallel at a time."""

    def __init__(self, model: Model, n_parallel: int, n_threads: int = 2,
                 on_context: Callable[[Context], None] | None = None, micro_batch: int | None = None,
                 counters: Callable[[], dict[str, float]] | None = None, flash_attn_type: int = -1,
                 around_decode: tuple[Callable[[Context, int], None], Callable[[Context], None]] | None = None
                 ) -> None:
        self.model = model
        self.n_parallel = n_parallel
        self.n_threads = n_threads
        self.on_context = on_context  # e.g. installs a MoE hook on the new context
        self.micro_batch = micro_batch  # tokens per graph (an expert cache bounds it)
        self.counters = counters  # e.g. the expert cache's: summed over decode calls
        self.flash_attn_type = flash_attn_type
        self.around_decode = around_decode  # (before(ctx, step), after(ctx)): e.g. the compute gate

    def run(self, requests: list[Request]) -> RunStats:
        """Decode a fixed list of requests."""
        if not requests:
            return RunStats()
        params = context_params(requests, self.n_parallel, self.n_threads, self.micro_batch, self.flash_attn_type)
        return self.serve(FixedSource(requests), params)

    def serve(self, source: RequestSource, params: ContextParams) -> RunStats:
        """Decode what source gives, as it comes (continuous batching), until it runs dry."""
        stats = RunStats()
        with Context(self.model, params) as ctx:
            if self.on_context:
                self.on_context(ctx)
            self._loop(ctx, source, stats)
        return stats

    def _loop(self, ctx: Context, source: RequestSource, stats: RunStats) -> None:
        requests: list[Request] = []  # in arrival order: BatchCall rows index into it
        pending: deque[int] = deque()
        running: list[int] = []
        free = list(range(self.n_parallel))
        t0 = time.perf_counter()
        while True:
            for req in source.take(len(free) - len(pending)):
                requests.append(req)
                pending.append(len(requests) - 1)
            if not pending and not running:
                if not source.idle_wait():
                    return
                continue
            admitted, budget = [], ctx.params.n_batch
            while pending and free and (not admitted or len(requests[pending[0]].prompt_tokens) <= budget):
                i = pending.popleft()
                requests[i].seq = free.pop(0)
                budget -= len(requests[i].prompt_tokens)
                admitted.append(i)
            if admitted:
                rows = [(i, tok, pos) for i in admitted for pos, tok in enumerate(requests[i].prompt_tokens)]
                t = time.perf_counter()
                self._decode(ctx, requests, rows, prefill=True, stats=stats)
                stats.prefill_s += time.perf_counter() - t
                stats.prefill_tokens += len(rows)
                for i in admitted:
                    requests[i].ttft_s = time.perf_counter() - t0
                running += admitted
            running = self._retire(ctx, requests, running, free)
            if not running:
                continue
            rows = [(i, requests[i].next_input(), requests[i].n_past) for i in running]
            before = self.counters() if self.counters else {}
            t = time.perf_counter()
            self._decode(ctx, requests, rows, prefill=False, stats=stats)
            stats.decode_s += time.perf_counter() - t
            for key, value in (self.counters() if self.counters else {}).items():
                stats.decode_counters[key] = stats.decode_counters.get(key, 0) + value - before[key]
            stats.decode_tokens += len(rows)
            running = self._retire(ctx, requests, running, free)

    def _decode(self, ctx: Context, requests: list[Request], rows: list[tuple[int, int, int]],
                prefill: bool, stats: RunStats) -> None:
        """Decode rows (request index, token, position); the last row of each request outputs."""
        last = {i: n for n, (i, _, _) in enumerate(rows)}
        batch = [(tok, pos, requests[i].seq, last[i] == n) for n, (i, tok, pos) in enumerate(rows)]
        stats.calls.append(BatchCall(prefill=prefill, rows=[i for i, _, _ in rows]))
        if self.around_decode:
            self.around_decode[0](ctx, len(stats.calls))
        try:
            outputs = ctx.decode(batch)
        finally:
            if self.around_decode:
                self.around_decode[1](ctx)
        for row in outputs:
            req = requests[rows[row][0]]
            token, margin = req.choose(ctx, row)
            req.record(token, margin, self.model.is_eog(token), self.model.piece(token))

    def _retire(self, ctx: Context, requests: list[Request], running: list[int], free: list[int]) -> list[int]:
        """Free the sequences of finished (or cancelled) requests: their KV cells and ids."""
        still = []
        for i in running:
            if requests[i].cancelled and not requests[i].finished:
                requests[i].fail("cancelled")
            if requests[i].finished:
                ctx.seq_rm(requests[i].seq)
                free.append(requests[i].seq)
                free.sort()
            else:
                still.append(i)
        return still
