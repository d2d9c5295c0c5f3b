"""Decodes the same tokens with llama_decode and with layer-range calls; prints JSON (for the tests).

usage: layers_probe.py MODEL
Two sequences: their prompts, then one more token each. The reference context decodes them with
llama_decode; the other with llama_decode_layers as the self-balancing runner does (the first call
of a block embeds it and runs layer 0's attention and router, each later call resumes after the
attention its predecessor's lookahead ran), the extra token with layers merged into one call.
Then three sequences regrouped mid-token (regroup). Prints the largest logit difference per block
and the errors of two misuses of the API.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf._native.loader import use_libllama
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model


def by_layers(ctx: Context, rows: list[tuple[int, int, int, bool]], ends: list[int]) -> None:
    """Run rows through the model in calls ending at each layer of `ends` (the last: n_layer)."""
    ctx.decode_layers(rows, None, 0, 0, True, False)
    begin = 0
    for end in ends:
        final = end == ctx.model.n_layer
        ctx.decode_layers(rows, [ctx.hidden(len(rows))], begin, end, not final, True)
        begin = end


def regroup(model: Model, cache: ExpertCache, params: ContextParams) -> float:
    """Three sequences; a token of the middle one runs its first layers alone, then the other two
    run whole together, then it finishes: llama_decode's logits in the same groups. With one KV
    stream for all (kv_unified) the two share a ubatch, so a recurrent memory gathers their cells,
    moving the middle one's states while its token is half done; with a stream per sequence
    llama.cpp splits them (consecutive sequences only)."""
    return max(_regroup(model, cache, dataclasses.replace(params, n_seq_max=3, kv_unified=unified))
               for unified in (True, False))


def _regroup(model: Model, cache: ExpertCache, params: ContextParams) -> float:
    with Context(model, params) as ref, Context(model, params) as ctx:
        cache.attach(ref)
        cache.attach(ctx)
        texts = ["The quick brown fox", "1, 2, 3, 5, 8", "def f(x):"]
        prompts = [model.tokenize(t) for t in texts]
        rows = [(t, p, s, p == len(toks) - 1) for s, toks in enumerate(prompts) for p, t in enumerate(toks)]
        last = [i for i, r in enumerate(rows) if r[3]]
        ref.decode(rows)
        by_layers(ctx, [(t, p, s, True) for t, p, s, _ in rows], [model.n_layer])
        step = [(int(ref.logits(i).argmax()), len(prompts[s]), s, True) for s, i in enumerate(last)]
        middle, others = [step[1]], [step[0], step[2]]
        ref.decode(middle)
        want = [ref.logits(0)]
        ref.decode(others)
        want += [ref.logits(0), ref.logits(1)]
        ctx.decode_layers(middle, None, 0, 0, True, False)
        ctx.decode_layers(middle, [ctx.hidden(1)], 0, 1, True, True)
        h = ctx.hidden(1)
        by_layers(ctx, others, [model.n_layer])
        got_others = [ctx.logits(0), ctx.logits(1)]
        ctx.decode_layers(middle, [h], 1, model.n_layer, False, True)
        got = [ctx.logits(0)] + got_others
        return max(float(np.abs(w - g).max()) for w, g in zip(want, got))


def error_of(call: Callable[[], object]) -> str:
    """The BevyError message the call raises, or "" if it succeeds."""
    try:
        call()
    except BevyError as e:
        return str(e)
    return ""


def main() -> int:
    path = Path(sys.argv[1])
    lib = use_libllama("patched")
    llama_ext.set_lazy_experts(lib, True)
    info = inspect_model(path)
    params = ContextParams(n_ctx=256, n_batch=64, n_seq_max=2, n_threads=1)
    out: dict[str, object] = {}
    with Model(lib, path) as model, ExpertCache(info, info.expert_bytes, LinkSpec("ram")) as cache, \
            Context(model, params) as ref, Context(model, params) as ctx:
        cache.attach(ref)
        cache.attach(ctx)
        n_layer = model.n_layer
        prompts = [model.tokenize("The quick brown fox"), model.tokenize("1, 2, 3, 5, 8")]
        prompt_rows = [(t, p, s, p == len(toks) - 1) for s, toks in enumerate(prompts) for p, t in enumerate(toks)]
        last = [i for i, r in enumerate(prompt_rows) if r[3]]
        ref.decode(prompt_rows)
        want = [ref.logits(i) for i in last]
        by_layers(ctx, [(t, p, s, True) for t, p, s, _ in prompt_rows], list(range(1, n_layer + 1)))
        got = [ctx.logits(i) for i in last]
        out["prompt_max_diff"] = max(float(np.abs(w - g).max()) for w, g in zip(want, got))
        out["logit_scale"] = max(float(np.abs(w).max()) for w in want)
        step = [(int(want[s].argmax()), len(toks), s, True) for s, toks in enumerate(prompts)]
        ref.decode(step)
        want = [ref.logits(j) for j in range(2)]
        by_layers(ctx, step, [2, n_layer])  # layers 0-1 merged, then the rest in one call
        out["merged_max_diff"] = max(float(np.abs(w - ctx.logits(j)).max()) for j, w in enumerate(want))
        out["regroup_max_diff"] = regroup(model, cache, params)
        row = [(step[0][0], len(prompts[0]) + 1, 0, True)]
        ctx.decode_layers(row, None, 0, 0, True, False)
        h = ctx.hidden(1)
        out["partial_without_lookahead"] = error_of(lambda: ctx.decode_layers(row, [h], 0, 1, False, True))
        out["reuse_without_hidden"] = error_of(lambda: ctx.decode_layers(row, None, 0, 1, True, True))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
