"""The reference routing of a bench workload, recorded in its own (patched) process.

usage: python -m bevy_gguf.bench.reference MODEL REQUESTS PROMPT_TOKENS STEPS THREADS
       python -m bevy_gguf.bench.reference --serve '<json: model, requests, prompt_range, decode_range,
                                             seed, parallel, threads, warmup>'
Prints {"prefill": [[layer, experts]...], "decode": [[layer, experts]...], "working_set": [...]}:
the visits of the blocking order. Teacher forcing makes the routing the same for every system.
The burst's "prefill" is each layer's prompt experts (what warms the cache) and "decode" its
steps; a serving stream's "prefill" is every call that ended before its steady-state window
(bench/window.py; prompts and decode alike: the warm-up) and "decode" every call that ended inside
it, with their decode tokens ("decode_tokens": a decode call's rows, one output each).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bevy_gguf._native.llama_handles import Model
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.analysis.replay import blocking_order
from bevy_gguf.analysis.routing import RouterTrace
from bevy_gguf.analysis.trace import trace_workload
from bevy_gguf.bench.window import steady_window
from bevy_gguf.bench.working_set import Visit, working_set
from bevy_gguf.engine.runners.batched import BatchedRunner
from bevy_gguf.engine.stats import BatchCall
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.workload.serving import ServeShape, serving_requests


class _TimedRunner(BatchedRunner):
    """The batched runner, stamping the end of each call (to place it against the window)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call_ends: list[float] = []

    def _decode(self, *args: Any, **kwargs: Any) -> None:
        super()._decode(*args, **kwargs)
        self.call_ends.append(time.perf_counter())


def burst_order(model: str, requests: int, prompt_tokens: int, steps: int, threads: int) -> dict[str, Any]:
    sel, n_expert, prefill = trace_workload(Path(model), requests, prompt_tokens, steps, threads, with_prefill=True)
    decode = blocking_order(sel)
    n_moe = sel.shape[1]
    calls = [(requests, decode[s * n_moe:(s + 1) * n_moe]) for s in range(steps)]
    return {"prefill": prefill, "decode": decode, "working_set": working_set(calls, n_moe * n_expert)}


def serve_order(spec: dict[str, Any]) -> dict[str, Any]:
    """The stream through blocking's schedule (the batched runner, every expert resident), split
    at its steady-state window."""
    path = Path(spec["model"])
    info = inspect_model(path)
    shape = ServeShape(requests=spec["requests"], prompt_tokens=tuple(spec["prompt_range"]),
                       decode_tokens=tuple(spec["decode_range"]), seed=spec.get("seed", 0))
    with Model(use_libllama("patched"), path) as model:
        requests = serving_requests(model, shape)
        trace = RouterTrace(model.n_layer, info.n_expert_used)
        try:
            runner = _TimedRunner(model, spec["parallel"], spec["threads"], on_context=trace.install)
            stats = runner.run(requests)
            layers = {il: trace.layer(il) for il in info.moe_layers}
        finally:
            trace.close()
    window = steady_window([r.times[-1] for r in requests if r.times], spec["parallel"], spec["warmup"])
    warm: list[Visit] = []
    inside: list[tuple[int, list[Visit]]] = []
    for call, end, visits in zip(stats.calls, runner.call_ends, _call_visits(stats.calls, layers)):
        if end <= window.start:
            warm += visits
        elif window.holds(end):
            inside.append((0 if call.prefill else len(call.rows), visits))
    return {"prefill": warm, "decode": [v for _, vs in inside for v in vs], "decode_tokens": sum(t for t, _ in inside),
            "working_set": working_set(inside, len(info.moe_layers) * info.n_expert)}


def _call_visits(calls: list[BatchCall], layers: dict[int, np.ndarray]) -> list[list[Visit]]:
    """Each call's visits: per MoE layer, the distinct experts of its rows (at the last layer only
    the rows that output reach the experts, BatchCall.output_rows)."""
    outputs = [len(c.output_rows()) for c in calls]
    rows = [len(c.rows) for c in calls]
    out: list[list[Visit]] = [[] for _ in calls]
    for il, sel in layers.items():
        counts = rows if len(sel) == sum(rows) else outputs if len(sel) == sum(outputs) else None
        if counts is None:
            raise BevyError(f"the router trace of layer {il} has {len(sel)} rows, the calls {sum(rows)}: "
                            "it does not match the schedule")
        start = 0
        for c, n in enumerate(counts):
            out[c].append((il, sorted(set(sel[start:start + n].ravel().tolist()))))
            start += n
    return out


def main() -> int:
    if sys.argv[1] == "--serve":
        order = serve_order(json.loads(sys.argv[2]))
    else:
        model, requests, prompt_tokens, steps, threads = sys.argv[1], *map(int, sys.argv[2:6])
        order = burst_order(model, requests, prompt_tokens, steps, threads)
    print(json.dumps(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
