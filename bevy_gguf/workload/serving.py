"""The serving workload (`bench --workload serve`): a seeded stream of requests of varied lengths.

A server's requests differ in topic and length: each request here is one text of the text
workload's kinds in turn (prose, code, numbers, languages; pieces of the same kind joined until
it is long enough), its prompt the text's first `prompt` tokens and its decode steps the next
`decode` tokens (teacher forcing, so every system decodes the same tokens and routes them alike).
Lengths are log-uniform in their ranges (short prompts are common, long ones costly), drawn from
the seed alone: the same seed gives the same stream on every machine. The runners serve the stream
closed-loop: `--parallel` requests in flight, the next joining as soon as one leaves.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bevy_gguf.engine.request import Request
from bevy_gguf.errors import BevyError
from bevy_gguf.workload import texts as workload

if TYPE_CHECKING:
    from bevy_gguf._native.llama_handles import Model

PROMPT_TOKENS = (16, 512)  # default ranges (inclusive)
DECODE_TOKENS = (32, 256)
SERVE_REQUESTS_PER_SEQ = 4  # bench's default stream: this many requests per sequence in flight
MAX_PIECES = 64  # pieces of one kind joined at most for one request's text


@dataclass(frozen=True, slots=True)
class ServeShape:
    """How many requests, and the ranges their lengths are drawn from."""

    requests: int = 32
    prompt_tokens: tuple[int, int] = PROMPT_TOKENS
    decode_tokens: tuple[int, int] = DECODE_TOKENS
    seed: int = 0

    def __post_init__(self) -> None:
        for name, (lo, hi) in (("prompt", self.prompt_tokens), ("decode", self.decode_tokens)):
            if not 1 <= lo <= hi:
                raise BevyError(f"serve workload: {name} lengths {lo}..{hi} are not a range of positive lengths")


def serve_range(default: tuple[int, int], top: int) -> tuple[int, int]:
    """A length range up to top (bench's --prompt-tokens or --steps): the default's lower end
    (at most top) to top."""
    return min(default[0], top), top


def log_uniform(r: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniformly."""
    return min(hi, max(lo, round(math.exp(r.uniform(math.log(lo), math.log(hi + 1))) - 0.5)))


def serve_lengths(shape: ServeShape) -> list[tuple[int, int]]:
    """(prompt tokens, decode tokens) of every request, from the seed alone."""
    r = random.Random(f"serve-{shape.seed}")
    return [(log_uniform(r, *shape.prompt_tokens), log_uniform(r, *shape.decode_tokens))
            for _ in range(shape.requests)]


def serving_requests(model: Model, shape: ServeShape, forced: bool = True) -> list[Request]:
    """The stream's requests, in arrival order: prompt and teacher-forced decode steps (or, with
    forced=False, that many generated tokens) of a text of the request's kind."""
    kinds = len(workload.KINDS)
    pool = workload.texts(kinds * (shape.requests + MAX_PIECES), shape.seed)
    out = []
    for i, (n_prompt, n_decode) in enumerate(serve_lengths(shape)):
        tokens = _text_tokens(model, pool, i, kinds, n_prompt + n_decode)
        out.append(Request(prompt=model.detokenize(tokens[:n_prompt]), prompt_tokens=tokens[:n_prompt],
                           max_tokens=n_decode + 1,
                           forced=tokens[n_prompt:n_prompt + n_decode] if forced else None))
    return out


def _text_tokens(model: Model, pool: list[workload.Text], i: int, kinds: int, need: int) -> list[int]:
    """At least `need` tokens of request i's text: pieces of its kind from the pool, joined."""
    pieces: list[str] = []
    tokens: list[int] = []
    for j in range(MAX_PIECES):
        pieces.append(pool[(i + kinds * j) % len(pool)].text)
        tokens = model.tokenize("\n\n".join(pieces))
        if len(tokens) >= need:
            return tokens
    raise BevyError(f"serve workload: request {i} needs {need} tokens, its text has {len(tokens)}: "
                    "lower the length ranges")
