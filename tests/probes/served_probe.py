"""The bench's serving stream through stock llama-server and bevy-gguf serve (bench/served.py), and
stock llama.cpp's greedy answers to the same prompts, one at a time, for the tests.

usage: served_probe.py '<served spec json>' SYSTEM[,SYSTEM...]; prints JSON: per request the
reference's trusted text (its tokens up to the first near-tie, docs/correctness.md) and how many
tokens that is, and per system the run's row (answers kept).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf.bench import served
from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import Request
from bevy_gguf.soak.mix import trusted_count


def main() -> int:
    spec, systems = json.loads(sys.argv[1]), sys.argv[2].split(",")
    stream = served.stream_of(spec)
    n_ctx = served.per_request_ctx(stream, spec["prompt_range"][1])
    config = EngineConfig(model=Path(spec["model"]), engine="stock", n_parallel=1, n_threads=spec["threads"],
                          n_ctx=n_ctx, flash_attn=spec.get("flash_attn", "auto"))
    with LLMEngine(config) as engine:
        m = engine.model
        requests = [Request(prompt=r.prompt, prompt_tokens=m.tokenize(r.prompt), max_tokens=r.max_tokens,
                            ignore_eos=True) for r in stream]
        engine.generate(requests)
        reference = []
        for req in requests:
            k = trusted_count(req.margins)
            reference.append({"trusted": b"".join(m.piece(t) for t in req.tokens[:k]).decode(errors="ignore"),
                              "trusted_tokens": k, "tokens": len(req.tokens)})
    runs = {s: served.run(spec | {"system": s, "keep_answers": True}) for s in systems}
    for row in runs.values():
        row.pop("request_times", None)
    print(json.dumps({"reference": reference, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
