"""The batched runner: one llama context, all running sequences decoded together each step.

This is what llama-server does with `--parallel N` (and what `--engine stock` means):
up to N requests run at once, each on its own sequence id; a step first prefills the prompts of
newly admitted requests in one batch, then decodes one token of every running request in one
batch. With N = 1 the prompts are decoded one at a time. The schedule depends only on the
requests, so every engine that uses this runner sees the same batches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.engine.request import MULTIBYTE_SLACK, Request
from bevy_gguf.engine.source import FixedSource, RequestSource
from bevy_gguf.engine.stats import BatchCall, RunStats
from bevy_gguf.errors import BevyError


def context_params(requests: list[Request], n_parallel: int, n_threads: int,
                   micro_batch: int | None = None, flash_attn_type: int = -1,
                   kv_unified: bool = False) -> ContextParams:
    """A context that fits any n_parallel of the requests at once; graphs of at most
    micro_batch tokens (None: a whole batch per graph); one KV stream, or one per sequence."""
    longest = max(len(r.prompt_tokens) + r.n_steps + 1 + MULTIBYTE_SLACK for r in requests)
    prompts = sorted((len(r.prompt_tokens) for r in requests), reverse=True)
    n_batch = max(sum(prompts[:n_parallel]), n_parallel, 32)
    n_ubatch = min(micro_batch, n_batch) if micro_batch else None
    return ContextParams(n_ctx=n_parallel * longest, n_batch=n_batch, n_seq_max=n_parallel, n_threads=n_threads,
                         n_ubatch=n_ubatch, flash_attn_type=flash_attn_type, kv_unified=kv_unified)


class BatchedRunner:
    """Decodes requests on one context, n_parallel at a time. With an expert cache, the
    context's expert matmuls are served from it (prefetch: it also loads what the next layer's
    router predicts) and its graphs hold at most the tokens whose experts the cache can pin."""

    def __init__(self, model: Model, n_parallel: int, n_threads: int, flash_attn_type: int = -1,
                 cache: ExpertCache | None = None, prefetch: bool = False,
                 on_context: Callable[[Context], None] | None = None, two_pass: bool = False,
                 kv_unified: bool = False) -> None:
        self.model = model
        self.n_parallel = n_parallel
        self.n_threads = n_threads
        self.flash_attn_type = flash_attn_type
        self.kv_unified = kv_unified  # one KV stream for every sequence (llama.cpp's -kvu), or one each
        self.cache = cache
        self.prefetch = prefetch
        self.on_context = on_context  # e.g. installs a router trace on the new context
        self.two_pass = two_pass  # see ExpertCache.attach
        self.micro_batch: int | None = None  # tokens per graph (an expert cache bounds it), once known
        if cache is not None:
            if prefetch:
                cache.enable_prefetch(str(model.path))
            cache.set_concurrency(1)

    def _micro_batch(self, tokens: int) -> int | None:
        """Tokens per graph for batches of up to `tokens` (None: no bound)."""
        cache = self.cache
        self.micro_batch = None if cache is None else cache.layout.micro_batch(cache.min_class_slots, tokens)
        return self.micro_batch

    def run(self, requests: list[Request]) -> RunStats:
        """Decode a fixed list of requests."""
        if not requests:
            return RunStats()
        limit = max(len(r.prompt_tokens) for r in requests) * self.n_parallel
        params = context_params(requests, self.n_parallel, self.n_threads, self._micro_batch(limit),
                                self.flash_attn_type, self.kv_unified)
        return self.serve(FixedSource(requests), params)

    def serving_params(self, ctx_per_seq: int) -> ContextParams:
        """A context for a live queue: n_parallel sequences of ctx_per_seq tokens each."""
        micro_batch = self._micro_batch(ctx_per_seq * self.n_parallel)
        return ContextParams(n_ctx=self.n_parallel * ctx_per_seq, n_batch=ctx_per_seq, n_seq_max=self.n_parallel,
                             n_threads=self.n_threads, n_ubatch=min(micro_batch or ctx_per_seq, ctx_per_seq),
                             flash_attn_type=self.flash_attn_type, kv_unified=self.kv_unified)

    def serve(self, source: RequestSource, params: ContextParams) -> RunStats:
        """Decode what source gives, as it comes (continuous batching), until it runs dry."""
        stats = RunStats()
        with Context(self.model, params) as ctx:
            if self.cache is not None:
                self.cache.attach(ctx, prefetch=self.prefetch, two_pass=self.two_pass)
            if self.on_context:
                self.on_context(ctx)
            self._loop(ctx, source, stats)
        return stats

    def _loop(self, ctx: Context, source: RequestSource, stats: RunStats) -> None:
        # in flight, by arrival index (BatchCall rows hold these); a served request leaves at its end
        requests: dict[int, Request] = {}
        self._keep_calls = source.finite
        arrived = 0
        pending: deque[int] = deque()
        running: list[int] = []
        free = list(range(self.n_parallel))
        t0 = time.perf_counter()
        while True:
            for req in source.take(len(free) - len(pending)):
                requests[arrived] = req
                pending.append(arrived)
                arrived += 1
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
            # in sequence order, as llama-server's slots: llama.cpp splits a batch over a KV stream per
            # sequence into one ubatch per run of consecutive sequence ids
            running.sort(key=lambda i: requests[i].seq)
            rows = [(i, requests[i].next_input(), requests[i].n_past) for i in running]
            before = self.cache.counters() if self.cache else {}
            t = time.perf_counter()
            self._decode(ctx, requests, rows, prefill=False, stats=stats)
            stats.decode_s += time.perf_counter() - t
            for key, value in (self.cache.counters() if self.cache else {}).items():
                stats.decode_counters[key] = stats.decode_counters.get(key, 0) + value - before[key]
            stats.decode_tokens += len(rows)
            running = self._retire(ctx, requests, running, free)

    def _decode(self, ctx: Context, requests: dict[int, Request], rows: list[tuple[int, int, int]],
                prefill: bool, stats: RunStats) -> None:
        """Decode rows (request index, token, position); the last row of each request outputs."""
        last = {i: n for n, (i, _, _) in enumerate(rows)}
        batch = [(tok, pos, requests[i].seq, last[i] == n) for n, (i, tok, pos) in enumerate(rows)]
        stats.n_calls += 1
        if self._keep_calls:
            stats.calls.append(BatchCall(prefill=prefill, rows=[i for i, _, _ in rows]))
        if self.cache is not None:  # its progress, and a turn at the compute gate
            self.cache.begin(ctx, stats.n_calls)
        try:
            outputs = ctx.decode(batch)
        except BevyError as e:  # a load failed or timed out: the call's requests fail, the loop goes on
            for i in {i for i, _, _ in rows}:
                requests[i].fail(str(e))
            return
        finally:
            if self.cache is not None:
                self.cache.end(ctx)
        for row in outputs:
            req = requests[rows[row][0]]
            token, margin = req.choose(ctx, row)
            req.record(token, margin, self.model.is_eog(token), self.model.piece(token))

    def _retire(self, ctx: Context, requests: dict[int, Request], running: list[int], free: list[int]) -> list[int]:
        """Free the sequences of finished (or cancelled) requests: their KV cells and ids (and,
        serving, forget them: a server's requests must not pile up)."""
        still = []
        for i in running:
            if requests[i].cancelled and not requests[i].finished:
                requests[i].fail("cancelled")
            if requests[i].finished:
                ctx.seq_rm(requests[i].seq)
                free.append(requests[i].seq)
                free.sort()
                if not self._keep_calls:
                    del requests[i]
            else:
                still.append(i)
        return still
