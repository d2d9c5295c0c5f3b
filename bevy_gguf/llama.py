"""The Python API: llama-cpp-python's `Llama`, whose concurrent requests run on the bevy engine.

    with bevy_gguf.Llama("model.gguf", n_parallel=8, expert_cache="25%") as llm:
        out = llm.create_completion("Hello", max_tokens=32, temperature=0)
        outs = llm.generate_many(["a", "b", "c"], max_tokens=32)

Its keyword arguments are EngineConfig's (n_parallel, n_threads, n_ctx, scheduler, expert_cache,
link, eviction, link_workers, wait_timeout_s, seed) plus llama_cpp.Llama's flash_attn (default
False, as there); one LLMEngine serves them: the model, one bounded expert cache that every
decoding context shares, and the scheduler's runner.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import MULTIBYTE_SLACK, Request
from bevy_gguf.engine.sampling import Sampler, SamplingParams
from bevy_gguf.engine.stats import hit_rate
from bevy_gguf.errors import BevyError

_SAMPLING_ARGS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
                  "presence_penalty", "seed")
_UNSUPPORTED = ("suffix", "logprobs", "stream", "grammar", "logits_processor", "stopping_criteria", "logit_bias",
                "mirostat_mode")
_IGNORED = ("verbose",)  # llama_cpp.Llama arguments that change nothing here


class Llama:
    """Concurrent completions on a MoE GGUF whose experts do not fit in fast memory."""

    def __init__(self, model_path: str | Path, n_parallel: int = 8, n_ctx: int = 2048, flash_attn: bool = False,
                 **kwargs: Any) -> None:
        config, rest = EngineConfig.from_kwargs(model_path, n_parallel=n_parallel, n_ctx=n_ctx,
                                                flash_attn="on" if flash_attn else "off", **kwargs)
        unknown = [k for k in rest if k not in _IGNORED]
        if unknown:
            raise BevyError(f"bevy_gguf.Llama does not take {', '.join(unknown)}: drop "
                            f"{'it' if len(unknown) == 1 else 'them'}")
        if config.engine != "bevy":
            raise BevyError("bevy_gguf.Llama runs the bevy engine: for stock llama.cpp use llama_cpp.Llama")
        self.config = config
        self.engine = LLMEngine(config)
        self.model_path, self.model, self.lib = config.model, self.engine.model, self.engine.lib
        self.n_parallel, self.n_threads, self.n_ctx = config.n_parallel, config.n_threads, n_ctx
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
        try:
            self.engine.generate(requests)
        finally:
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
        if self._closed:
            raise BevyError("this Llama is closed")
        cache = self.engine.cache
        c = cache.counters()
        return c | {"hit_rate": hit_rate(c), "link": cache.link_name, "cache_bytes": cache.budget_bytes,
                    "cache_slots": cache.n_slots, "scheduler": self.config.scheduler}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
