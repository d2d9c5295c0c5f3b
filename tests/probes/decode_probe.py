"""A fixed decode schedule on one libllama, for the tests (run in its own process).

usage: decode_probe.py --lib stock|patched --model M.gguf --out LOGITS.npy [--hook none|trace|shift|bad-id|fail]
                [--hook-after-first] [--cache SIZE [--device NAME [--delay-writes SECONDS]]]
Prefills three prompts in one batch, then decodes four greedy steps of all three; saves every
output's logits and prints JSON (outputs, errors, what the router trace recorded).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

import numpy as np

from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf._native.loader import loaded_libllama, use_libllama
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model

PROMPTS = ["Hello, world", "def f(x): return 2*x", "Grüß Gott 你好"]
STEPS = 4


def python_hook(kind: str):  # noqa: ANN201
    from bevy_gguf._native.libbevy import MOE_HOOK_FN

    def hook(_user: int, call_p: ctypes.c_void_p) -> int:
        call = call_p.contents
        n = call.n_tokens * call.n_expert_used
        for t in range(call.n_tokens):
            for j in range(call.n_expert_used):
                e = call.ids[t * call.ids_stride + j]
                if kind == "shift":
                    call.out[t * call.n_expert_used + j] = (e + 1) % call.n_out_max
                else:
                    call.out[t * call.n_expert_used + j] = call.n_out_max if kind == "bad-id" else e
        return 1 if kind == "fail" and n else 0

    return MOE_HOOK_FN(hook)


def delay_device_writes(llama_cpp, cache, info, seconds: float):  # noqa: ANN001, ANN201
    """Every expert copy into the device slots waits `seconds` first (a slow copy): a slot that
    were used before its copy completed would hold the wrong bytes. Returns the callback to keep."""
    import time

    from repack_probe import WRITER  # this folder is the script's sys.path[0]

    from bevy_gguf._native import llama_ext

    copy = WRITER(llama_ext.write_device_fn(llama_cpp))

    @WRITER
    def late(ggml_type: int, ne0: int, ne1: int, dst: int, src: int, nbytes: int) -> int:
        time.sleep(seconds)
        return copy(ggml_type, ne0, ne1, dst, src, nbytes)

    for t in info.expert_tensors:
        cache.native.set_writer(t.layer, cache.layout.kinds.index(t.kind), ctypes.cast(late, ctypes.c_void_p).value,
                                0, *t.ne)
    return late


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hook", default="none")
    ap.add_argument("--hook-after-first", action="store_true")
    ap.add_argument("--cache", help="serve experts from an expert cache of this size (e.g. 50%%)")
    ap.add_argument("--eviction", default="next-use")
    ap.add_argument("--two-pass", action="store_true", help="MoE layers in two passes (patch 0004)")
    ap.add_argument("--device", help="the cache's slots in this ggml device's memory (patch 0008)")
    ap.add_argument("--delay-writes", type=float, default=0.0,
                    help="with --device: every copy into a slot starts this many seconds late")
    args = ap.parse_args()

    llama_cpp = use_libllama(args.lib)
    result: dict = {"libllama": loaded_libllama(), "error": None}
    keep = []
    cache = None
    if args.cache:
        from bevy_gguf._native import llama_ext
        from bevy_gguf.config import LinkSpec, parse_cache_size
        from bevy_gguf.engine.expert_cache import ExpertCache

        llama_ext.set_lazy_experts(llama_cpp, True)
        info = inspect_model(args.model)
        cache = ExpertCache(info, parse_cache_size(args.cache, info.expert_bytes), LinkSpec("file"),
                            policy=args.eviction, wait_timeout_s=60, device=args.device, lib=llama_cpp)
        if args.delay_writes:
            keep.append(delay_device_writes(llama_cpp, cache, info, args.delay_writes))
        result["store"] = cache.store
    with Model(llama_cpp, args.model) as model:
        prompts = [model.tokenize(p) for p in PROMPTS]
        params = ContextParams(n_ctx=256, n_batch=sum(map(len, prompts)), n_seq_max=3, n_threads=2)
        with Context(model, params) as ctx:
            trace = None

            def install() -> None:
                nonlocal trace
                from bevy_gguf._native import llama_ext
                if cache is not None:
                    cache.attach(ctx, two_pass=args.two_pass)
                elif args.hook == "trace":
                    from bevy_gguf.analysis.routing import RouterTrace
                    trace = RouterTrace(model.n_layer, inspect_model(args.model).n_expert_used)
                    trace.install(ctx)
                elif args.hook != "none":
                    fn = python_hook(args.hook)
                    keep.append(fn)
                    llama_ext.set_moe_hook(llama_cpp, ctx.ptr, ctypes.cast(fn, ctypes.c_void_p).value, None)

            if not args.hook_after_first:
                install()
            logits = []
            batch = [(tok, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, tok in enumerate(p)]
            try:
                outputs = ctx.decode(batch)
                logits += [ctx.logits(r) for r in outputs]
                last = [int(np.argmax(x)) for x in logits]
                for step in range(STEPS):
                    if step == 1 and args.hook_after_first:
                        install()
                    rows = ctx.decode([(last[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
                    out = [ctx.logits(r) for r in rows]
                    logits += out
                    last = [int(np.argmax(x)) for x in out]
            except BevyError as e:
                result["error"] = str(e)
            if trace is not None:
                result["trace_rows"] = [int(len(trace.layer(il))) for il in range(model.n_layer)]
                result["trace_ids"] = [trace.layer(il).tolist() for il in range(model.n_layer)]
                trace.close()
    if cache is not None:
        result["slots"] = cache.n_slots
        result["counters"] = cache.counters()
        result["staging_pinned"] = cache.staging_pinned()
        cache.close()
    np.save(args.out, np.array(logits, dtype=np.float32))
    result["outputs"] = len(logits)
    result["prompt_tokens"] = [len(p) for p in prompts]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
