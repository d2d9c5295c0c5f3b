"""`bevy-gguf run`: decode requests with an engine and report texts, tokens, margins, speed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bevy_gguf.engine.batched import BatchedRunner, RunStats
from bevy_gguf.engine.request import Request
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.libs import use_libllama
from bevy_gguf.llm import Model

ENGINES = ("stock",)


@dataclass(slots=True)
class RunResult:
    engine: str
    n_parallel: int
    requests: list[Request]
    texts: list[str]
    stats: RunStats

    def to_json(self) -> dict[str, Any]:
        """The §3 `run --json` document (stock fills only tok_per_s)."""
        return {
            "requests": [
                {"prompt": r.prompt, "text": t, "tokens": r.tokens, "margins": [round(m, 6) for m in r.margins]}
                for r, t in zip(self.requests, self.texts)
            ],
            "stats": {"tok_per_s": round(self.stats.tok_per_s, 3), "hit_rate": None,
                      "bytes_loaded": None, "stall_s": None, "link": None},
        }


def run_stock(model_path: Path, make_requests: Any, n_parallel: int, n_threads: int) -> RunResult:
    """Decode with unpatched llama.cpp: one context, n_parallel sequences batched per step."""
    inspect_model(model_path)
    llama_cpp = use_libllama("stock")
    with Model(llama_cpp, model_path) as model:
        requests: list[Request] = make_requests(model)
        stats = BatchedRunner(model, n_parallel, n_threads).run(requests)
        texts = [model.detokenize(r.tokens) for r in requests]
    return RunResult("stock", n_parallel, requests, texts, stats)
