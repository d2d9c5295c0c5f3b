"""Runs requests on the bevy engine inside one process and prints JSON (for the tests).

usage: engine_probe.py MODEL SCHEDULER CACHE PARALLEL SPEC.json
SPEC: {"prompts": [...], "max_tokens": n (or one per prompt), "stop": [...], "bad": [indices of requests given an
invalid token], "eviction": "...", "seed": n, "cancel": [[request, step], ...] (bevy: cancel a
request before that scheduling step, wherever its token stands), "threads": n (default 2),
"link": "..." (default file), "flash_attn": "auto|on|off" (default auto), "runahead": "auto|on|off"
(default the engine's), "prefill_wave": n (default the engine's), "layer_range_archs": [...] (stands in
for the archs patch 0003 covers: a test of what runs where an arch is not among them), "trace": true
(bevy: at each scheduling step, every request's decoded tokens, which requests prefill there and which decode),
"resident_steps": "rare-misses|all-in",
"seq_order": true (count the decode calls whose rows' sequence ids go down somewhere: llama.cpp then splits the
call into more ubatches, each computing its layers again)}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf._native.llama_handles import Context
from bevy_gguf.config import DEFAULT_RUNAHEAD, EngineConfig
from bevy_gguf.engine import registry
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import Request


def count_seq_order(calls: dict[str, int]) -> None:
    """Wrap Context.decode and decode_layers: calls["calls"] counts them, calls["out_of_order"] those
    whose rows' sequence ids go down somewhere."""
    def wrap(real):  # noqa: ANN001, ANN202
        def call(self, rows, *args):  # noqa: ANN001, ANN202
            seqs = [r[2] for r in rows]
            calls["calls"] += 1
            calls["out_of_order"] += any(b < a for a, b in zip(seqs, seqs[1:]))
            return real(self, rows, *args)
        return call
    Context.decode, Context.decode_layers = wrap(Context.decode), wrap(Context.decode_layers)


def main() -> int:
    model_path, scheduler, size, parallel = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    spec = json.loads(Path(sys.argv[5]).read_text())
    if "layer_range_archs" in spec:
        registry.LAYER_RANGE_ARCHS = tuple(spec["layer_range_archs"])
    config = EngineConfig(model=model_path, scheduler=scheduler, expert_cache=size, n_parallel=parallel,
                          n_threads=spec.get("threads", 2), link=spec.get("link", "file"),
                          eviction=spec.get("eviction", "next-use"), wait_timeout_s=60, seed=spec.get("seed", 0),
                          flash_attn=spec.get("flash_attn", "auto"), runahead=spec.get("runahead", DEFAULT_RUNAHEAD),
                          lanes=spec.get("lanes", 0), resident_steps=spec.get("resident_steps", "rare-misses"),
                          **({"prefill_wave": spec["prefill_wave"]} if "prefill_wave" in spec else {}))
    seq_order = {"calls": 0, "out_of_order": 0}
    if spec.get("seq_order"):
        count_seq_order(seq_order)
    with LLMEngine(config) as engine:
        requests = []
        n = spec["max_tokens"]  # one for all, or one per request
        max_tokens = n if isinstance(n, list) else [n] * len(spec["prompts"])
        for i, p in enumerate(spec["prompts"]):
            tokens = engine.model.tokenize(p)
            if i in spec.get("bad", []):
                tokens[len(tokens) // 2] = 10**6  # not a token: this request's decode fails
            requests.append(Request(prompt=p, prompt_tokens=tokens, max_tokens=max_tokens[i],
                                    stop=tuple(spec.get("stop", ()))))
        runner = engine.make_runner(parallel)
        cancel = {step: i for i, step in spec.get("cancel", [])}
        cancelled_at: dict[int, list] = {}
        trace: list[dict] = []
        if cancel or spec.get("trace"):
            def on_step(step: int, flights: list) -> None:
                if spec.get("trace"):
                    trace.append({"decoded": [r.n_decoded for r in requests],
                                  "prefilling": sorted({f.index for f in flights if f.prefill}),
                                  "decoding": sorted({f.index for f in flights if not f.prefill})})
                if step in cancel and cancel[step] not in cancelled_at:
                    i = cancel[step]
                    f = next((f for f in flights if f.index == i), None)
                    if f is None:  # in another lane (bevy runs a step loop per lane)
                        return
                    cancelled_at[i] = [f.layer, f.pos0, f.prefill]
                    requests[i].cancelled = True
            runner.on_step = on_step
        stats = engine.generate(requests, runner)
        print(json.dumps({
            "requests": [{"tokens": r.tokens, "margins": r.margins, "error": r.error, "finish": r.finish_reason}
                         for r in requests],
            "pinned_after": engine.cache.pinned(),
            "micro_batch": runner.micro_batch, "decode_tokens": stats.decode_tokens,
            "lanes": getattr(runner, "lanes_used", None), "permit_chunk": getattr(runner, "permit_chunk", None),
            "permit_prompts": getattr(runner, "permit_prompts", None),
            "counters": engine.counters(), "link": engine.cache.link_name,
            "cancelled_at": cancelled_at, "runahead": getattr(runner, "runahead_stats", None),
            "scheduler": engine.scheduler.name, "scheduler_note": engine.scheduler_note, "trace": trace,
            "seq_order": seq_order, "resident_calls": getattr(runner, "resident_calls", None),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
