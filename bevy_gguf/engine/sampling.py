"""Token choice: greedy (with the top-1 minus top-2 margin), or llama.cpp's sampler chain built
as llama-cpp-python builds it, so sampling behaves as in llama-cpp-python."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """llama-cpp-python's create_completion defaults; temperature 0 is greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    penalty_last_n: int = 64

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams(temperature=0.0)


def greedy(logits: np.ndarray) -> tuple[int, float]:
    """(argmax, top-1 minus top-2 logit); ties go to the lower token id. Three argmax passes
    over the vocabulary (the top one, then the best on each side of it), no sort or partition:
    at a real vocabulary (152k) a partition took 0.5 ms a row alone and about 8 ms beside the
    compute threads' spin, serially with every decode step (measured on 2 cores)."""
    a = int(np.argmax(logits))
    left, right = logits[:a], logits[a + 1:]
    if not left.size and not right.size:
        return a, float("inf")
    sides = ([int(np.argmax(left))] if left.size else []) + ([a + 1 + int(np.argmax(right))] if right.size else [])
    b = min(sides, key=lambda i: (-logits[i], i))
    return a, float(logits[a] - logits[b])


class Sampler:
    """A llama.cpp sampler chain for one request (llama-cpp-python's order: penalties, then
    greedy (temperature 0), dist (temperature < 0), or top-k, typical, top-p, min-p, temp, dist)."""

    def __init__(self, llama_cpp: ModuleType, n_vocab: int, params: SamplingParams) -> None:
        from llama_cpp import _internals

        self.lib = llama_cpp
        s = self.chain = _internals.LlamaSampler()
        s.add_penalties(n_vocab=n_vocab, penalty_last_n=params.penalty_last_n, penalty_repeat=params.repeat_penalty,
                        penalty_freq=params.frequency_penalty, penalty_present=params.presence_penalty)
        seed = DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
        if params.temperature < 0.0:
            s.add_dist(seed)
        elif params.temperature == 0.0:
            s.add_greedy()
        else:
            s.add_top_k(params.top_k)
            s.add_typical(params.typical_p, 1)
            s.add_top_p(params.top_p, 1)
            s.add_min_p(params.min_p, 1)
            s.add_temp(params.temperature)
            s.add_dist(seed)

    def sample(self, ctx_ptr: int, row: int) -> int:
        """Sample from batch row `row` of a context's logits (and accept the token)."""
        return int(self.lib.llama_sampler_sample(self.chain.sampler, ctx_ptr, row))

    def close(self) -> None:
        self.chain.close()
