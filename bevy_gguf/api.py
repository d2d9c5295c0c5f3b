"""The Python API: a llama_cpp `Llama` whose concurrent requests run on the bevy engine.

    with bevy_gguf.Llama("model.gguf", n_parallel=8, expert_cache="25%") as llm:
        out = llm.create_completion("Hello", max_tokens=32, temperature=0)
        outs = llm.generate_many(["a", "b", "c"], max_tokens=32)

`Llama` wraps llama-cpp-python's `Llama` (model, tokenizer, chat formats: `.llama`) and opens
its decoding contexts on that same model through llama_cpp's low-level API; the routed experts
live in one bounded cache that every context shares.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bevy_gguf import native
from bevy_gguf.engine.expert_cache import ExpertCache, hit_rate
from bevy_gguf.engine.request import MULTIBYTE_SLACK, Request
from bevy_gguf.engine.schedulers import get_scheduler, make_runner
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.libs import use_libllama
from bevy_gguf.llm import Model
from bevy_gguf.offload import LinkSpec, parse_cache_size
from bevy_gguf.sampling import Sampler, SamplingParams

_SAMPLING_ARGS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
                  "presence_penalty", "seed")
_UNSUPPORTED = ("suffix", "logprobs", "stream", "grammar", "logits_processor", "stopping_criteria", "logit_bias",
                "mirostat_mode")


class Llama:
    """Concurrent completions on a MoE GGUF whose experts do not fit in fast memory."""

    def __init__(self, model_path: str | Path, n_parallel: int = 8, expert_cache: str = "25%",
                 scheduler: str = "bevy", link: str = "file", eviction: str = "next-use", n_threads: int = 2,
                 n_ctx: int = 2048, **llama_kwargs: Any) -> None:
        if n_parallel < 1:
            raise BevyError(f"n_parallel must be at least 1, got {n_parallel}")
        self.model_path = Path(model_path)
        self.n_parallel, self.n_threads, self.n_ctx = n_parallel, n_threads, n_ctx
        self.scheduler = get_scheduler(scheduler)
        info = inspect_model(self.model_path)
        budget = parse_cache_size(expert_cache, info.expert_bytes)
        link_spec = LinkSpec.parse(link)
        self.lib = use_libllama("patched")
        native.llama_moe_set_lazy_experts(self.lib, True)
        import llama_cpp

        self.llama = llama_cpp.Llama(str(self.model_path), n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=0,
                                     verbose=llama_kwargs.pop("verbose", False), **llama_kwargs)
        self.model = Model(self.lib, self.model_path, ptr=self.llama._model.model)
        self.cache = ExpertCache(info, budget, link_spec, policy=eviction)
        self._closed = False

    # -- requests ------------------------------------------------------------------------

    def _request(self, prompt: str | list[int], max_tokens: int | None, stop: str | list[str] | None,
                 sampling: SamplingParams) -> Request:
        if self._closed:
            raise BevyError("this Llama is closed")
        tokens = self.model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise BevyError("the prompt is empty: give at least one character")
        room = self.n_ctx - len(tokens) - MULTIBYTE_SLACK
        if room < 1:
            raise BevyError(f"the prompt has {len(tokens)} tokens, n_ctx is {self.n_ctx}: shorten it or raise n_ctx")
        n = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        sampler = None if sampling.greedy else Sampler(self.lib, self.model.n_vocab, sampling)
        text = prompt if isinstance(prompt, str) else self.model.detokenize(tokens)
        return Request(prompt=text, prompt_tokens=tokens, max_tokens=n, sampler=sampler, stop=stops,
                       utf8_complete=True)

    def _run(self, requests: list[Request]) -> None:
        # the attention settings of the wrapped Llama's context: the same numerics as llama-cpp-python
        runner, _ = make_runner(self.scheduler, self.model, self.model_path, self.cache,
                                min(self.n_parallel, len(requests)), self.n_threads,
                                max(len(r.prompt_tokens) for r in requests),
                                flash_attn_type=int(self.llama.context_params.flash_attn_type))
        try:
            runner.run(requests)
        finally:
            self.cache.release_hooks()
            for r in requests:
                if r.sampler is not None:
                    r.sampler.close()

    def _completion(self, req: Request) -> dict[str, Any]:
        if req.error:
            raise BevyError(req.error)
        data = bytes(req.text_bytes)
        stops = [s.encode() for s in req.stop if s.encode() in data]
        if stops and req.finish_reason == "stop":
            data = data[: data.index(stops[0])]
        text = data.decode("utf-8", errors="ignore")
        n_out = len(req.tokens) - (1 if req.finish_reason == "stop" and req.tokens and
                                   self.model.is_eog(req.tokens[-1]) else 0)
        return {
            "id": f"cmpl-{uuid.uuid4()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": str(self.model_path),
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": req.finish_reason}],
            "usage": {"prompt_tokens": len(req.prompt_tokens), "completion_tokens": n_out,
                      "total_tokens": len(req.prompt_tokens) + n_out},
        }

    @staticmethod
    def _sampling(kwargs: dict[str, Any]) -> SamplingParams:
        for name in _UNSUPPORTED:
            if kwargs.get(name) not in (None, False, 0, [], {}):
                raise BevyError(f"{name}= is not supported by bevy_gguf.Llama yet: drop it")
        return SamplingParams(**{k: kwargs[k] for k in _SAMPLING_ARGS if k in kwargs and kwargs[k] is not None})

    # -- public --------------------------------------------------------------------------

    def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16,
                          stop: str | list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """llama_cpp.Llama.create_completion for one prompt (temperature, top_k, top_p, min_p,
        typical_p, repeat/frequency/presence penalties, seed, stop, max_tokens)."""
        req = self._request(prompt, max_tokens, stop, self._sampling(kwargs))
        self._run([req])
        return self._completion(req)

    __call__ = create_completion

    def generate_many(self, prompts: list[str | list[int]], max_tokens: int | None = 16,
                      stop: str | list[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        """Completions of every prompt, decoded concurrently (n_parallel at a time), in order."""
        sampling = self._sampling(kwargs)
        requests = [self._request(p, max_tokens, stop, sampling) for p in prompts]
        if requests:
            self._run(requests)
        return [self._completion(r) for r in requests]

    def stats(self) -> dict[str, Any]:
        """Expert-cache counters since the start: hits, misses, bytes loaded, stall, link busy."""
        c = self.cache.counters()
        return c | {"hit_rate": hit_rate(c), "link": self.cache.link_name, "cache_bytes": self.cache.budget_bytes,
                    "cache_slots": self.cache.n_slots, "scheduler": self.scheduler.name}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.cache.close()
            self.llama.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
