"""The runahead runner (`bevy-ctx`): a llama context per request, each on its own thread.

All contexts share one model and one expert cache. A context whose experts are resident keeps
computing while a context that misses waits in native code for its loads, so loads overlap
compute and the demand is revealed, not predicted. A compute gate bounds how many contexts
compute at once (so threads do not oversubscribe the cores) and admits the most lagging one
first (smallest token, then layer); load requests are served in the same order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.engine.request import Request
from bevy_gguf.engine.runners.batched import context_params
from bevy_gguf.engine.source import FixedSource, RequestSource
from bevy_gguf.engine.stats import RunStats, SpanUnion
from bevy_gguf.errors import BevyError


class ContextRunner:
    """Decodes each request on a context of its own, n_parallel contexts at a time."""

    def __init__(self, model: Model, cache: ExpertCache, n_parallel: int, n_threads: int = 2,
                 threads_per_context: int = 1, flash_attn_type: int = -1, two_pass: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.n_parallel = n_parallel
        self.n_threads = n_threads
        self.threads_per_context = threads_per_context
        self.concurrency = max(1, n_threads // threads_per_context)  # contexts computing at once
        self.flash_attn_type = flash_attn_type
        self.micro_batch: int | None = None  # tokens per graph, once known
        self.two_pass = two_pass  # see ExpertCache.attach

    def run(self, requests: list[Request]) -> RunStats:
        """Decode a fixed list of requests."""
        if not requests:
            return RunStats()
        n_ctx = min(self.n_parallel, len(requests))
        limit = max(len(r.prompt_tokens) for r in requests)
        micro_batch = self.micro_batch = self.cache.layout.micro_batch(self.cache.min_class_slots, limit,
                                                                          contexts=n_ctx)
        # sized like the stock reference's single context (`--engine stock --parallel 1`)
        params = context_params(requests, 1, self.threads_per_context, micro_batch, self.flash_attn_type)
        return self.serve(FixedSource(requests), params, n_ctx, barrier=len(requests) <= n_ctx)

    def serving_params(self, ctx_per_seq: int) -> ContextParams:
        """Each context's, for a live queue: one sequence of ctx_per_seq tokens."""
        self.micro_batch = self.cache.layout.micro_batch(self.cache.min_class_slots, ctx_per_seq,
                                                           contexts=self.n_parallel)
        return ContextParams(n_ctx=ctx_per_seq, n_batch=ctx_per_seq, n_seq_max=1, n_threads=self.threads_per_context,
                             n_ubatch=min(self.micro_batch, ctx_per_seq), flash_attn_type=self.flash_attn_type)

    def serve(self, source: RequestSource, params: ContextParams, n_ctx: int | None = None,
              barrier: bool = False) -> RunStats:
        """Decode what source gives, as it comes, on n_ctx contexts (default: n_parallel) of
        params each; with barrier, every context prefills before any decodes."""
        stats = RunStats()
        n_ctx = n_ctx or self.n_parallel
        self.cache.require_slots(n_ctx)
        self.cache.set_concurrency(self.concurrency)
        contexts: list[Context] = []
        try:
            for _ in range(n_ctx):
                ctx = Context(self.model, params)
                contexts.append(ctx)
                self.cache.attach(ctx, two_pass=self.two_pass)
            self._run_threads(contexts, source, stats, barrier)
        finally:
            for ctx in contexts:
                ctx.close()
            self.cache.release_hooks()
        return stats

    def _run_threads(self, contexts: list[Context], source: RequestSource, stats: RunStats, barrier: bool) -> None:
        lock = threading.Lock()
        decode_spans, prefill_spans = SpanUnion(), SpanUnion()
        t0 = time.perf_counter()
        at_decode: dict[str, int] = {}

        # when every request has a context, all prefill before any decodes: the phases (and
        # their counters) then separate cleanly, as in the batched runner
        prefilled = None
        if barrier:
            prefilled = threading.Barrier(len(contexts), action=lambda: at_decode.update(self.cache.counters()))

        def take() -> Request | None:
            while True:
                with lock:
                    got = source.take(1)
                if got:
                    return got[0]
                if not source.idle_wait():
                    return None

        def attempt(req: Request, step: Callable[[Request], None]) -> None:
            try:
                step(req)
            except BevyError as e:
                req.fail(str(e))  # this request fails alone

        def serve(ctx: Context) -> None:
            first = True
            while (req := take()) is not None:
                req.seq = 0
                attempt(req, lambda r: self._prefill(ctx, r, t0, lock, stats, prefill_spans))
                if first and prefilled is not None:
                    prefilled.wait()
                first = False
                attempt(req, lambda r: self._decode_steps(ctx, r, lock, stats, decode_spans))
                self.cache.end(ctx)
                ctx.seq_rm(0)  # its KV cells; pins go with every graph, failed or not
            if first and prefilled is not None:
                prefilled.wait()

        threads = [threading.Thread(target=serve, args=(ctx,), name=f"bevy-ctx-{n}") for n, ctx in enumerate(contexts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats.decode_s = decode_spans.seconds()
        stats.prefill_s = prefill_spans.seconds()
        end = self.cache.counters()
        stats.decode_counters = {k: end[k] - at_decode.get(k, 0) for k in end}

    def _prefill(self, ctx: Context, req: Request, t0: float, lock: threading.Lock, stats: RunStats,
                 spans: SpanUnion) -> None:
        rows = [(tok, pos, 0, pos == len(req.prompt_tokens) - 1) for pos, tok in enumerate(req.prompt_tokens)]
        start = time.perf_counter()
        self.cache.begin(ctx, 0)
        try:
            out = ctx.decode(rows)
        finally:
            self.cache.end(ctx)
        end = time.perf_counter()
        token, margin = req.choose(ctx, out[0])
        req.record(token, margin, self.model.is_eog(token), self.model.piece(token))
        req.ttft_s = end - t0
        with lock:
            spans.add(start, end)
            stats.prefill_tokens += len(rows)

    def _decode_steps(self, ctx: Context, req: Request, lock: threading.Lock, stats: RunStats,
                      spans: SpanUnion) -> None:
        while not req.finished:
            if req.cancelled:
                req.fail("cancelled")
                return
            start = time.perf_counter()
            self.cache.begin(ctx, req.n_decoded + 1)
            try:
                out = ctx.decode([(req.next_input(), req.n_past, 0, True)])
            finally:
                self.cache.end(ctx)
            end = time.perf_counter()
            token, margin = req.choose(ctx, out[0])
            req.record(token, margin, self.model.is_eog(token), self.model.piece(token))
            with lock:
                spans.add(start, end)
                stats.decode_tokens += 1
