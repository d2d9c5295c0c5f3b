"""A request: its prompt, what it was fed, what the model predicted, and its timings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bevy_gguf.engine.sampling import Sampler, greedy

if TYPE_CHECKING:
    from bevy_gguf._native.llama_handles import Context


MULTIBYTE_SLACK = 32  # tokens a completion may run past max_tokens while its text ends inside a UTF-8 character


@dataclass(slots=True)
class Request:
    """One sequence to decode.

    Generation (forced is None): greedy tokens are fed back until max_tokens or end of
    generation. Teacher forcing (forced given): decode steps feed forced[i] instead (the text
    workload), and tokens records what the model would have generated at each step.
    """

    prompt: str
    prompt_tokens: list[int]
    max_tokens: int
    forced: list[int] | None = None
    tokens: list[int] = field(default_factory=list)     # greedy prediction at each output
    times: list[float] = field(default_factory=list)    # time.perf_counter() at each output
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logit at each output
    finished: bool = False
    seq: int = -1
    ttft_s: float | None = None
    admitted_s: float | None = None  # time.perf_counter() when a runner took it from its source
    error: str | None = None  # why this request failed (it fails alone)
    sampler: Sampler | None = None  # None: greedy
    stop: tuple[str, ...] = ()      # stop strings: generation ends when the text contains one
    finish_reason: str | None = None  # "length", "stop" or "error"
    text_bytes: bytearray = field(default_factory=bytearray)  # bytes of the generated tokens
    utf8_complete: bool = False  # llama-cpp-python's rule: finish no token inside a UTF-8 character
    cancelled: bool = False  # set by a client that left: the runner drops it at its next step
    on_update: Callable[[Request], None] | None = field(default=None, repr=False)  # after each output
    multibyte_fix: int = 0  # tokens still to take before checks (an incomplete UTF-8 character)
    ignore_eos: bool = False  # generation goes on past end of generation (llama-server's ignore_eos)

    @property
    def n_past(self) -> int:
        """Tokens of this request in the KV cache."""
        return len(self.prompt_tokens) + self.n_decoded

    @property
    def n_decoded(self) -> int:
        """Decode steps done (tokens fed after the prompt)."""
        return max(len(self.tokens) - 1, 0)

    @property
    def n_steps(self) -> int:
        """Decode steps this request needs in all."""
        return len(self.forced) if self.forced is not None else self.max_tokens - 1

    def next_input(self) -> int:
        """The token the next decode step feeds."""
        if self.forced is not None:
            return self.forced[self.n_decoded]
        return self.tokens[-1]

    def record(self, token: int, margin: float, is_eog: bool, piece: bytes = b"") -> None:
        """Take one output (prediction and margin); finish when the request is done.

        Generation ends at end of generation, at a stop string, or at max_tokens. With
        utf8_complete (as llama-cpp-python's create_completion), a token ending inside a
        multi-byte UTF-8 character defers both checks (we stop deferring MULTIBYTE_SLACK tokens
        past max_tokens).
        """
        self.tokens.append(token)
        self.margins.append(margin)
        self.times.append(time.perf_counter())
        self._finish_check(is_eog, piece)
        if self.on_update is not None:
            self.on_update(self)

    def _finish_check(self, is_eog: bool, piece: bytes) -> None:
        if self.forced is not None:
            if self.n_decoded >= self.n_steps:
                self.finished, self.finish_reason = True, "length"
            return
        if is_eog and not self.ignore_eos:
            self.finished, self.finish_reason = True, "stop"
            return
        self.text_bytes += piece
        tail = self.text_bytes[-3:] if self.utf8_complete else b""
        for k, char in enumerate(tail):
            k = 3 - k
            for num, pattern in ((2, 192), (3, 224), (4, 240)):
                if num > k and pattern & char == pattern:
                    self.multibyte_fix = num - k
        if self.multibyte_fix > 0:
            self.multibyte_fix -= 1
            if len(self.tokens) < self.max_tokens + MULTIBYTE_SLACK:
                return
        elif any(s.encode() in self.text_bytes for s in self.stop):
            self.finished, self.finish_reason = True, "stop"
            return
        if len(self.tokens) >= self.max_tokens:
            self.finished, self.finish_reason = True, "length"

    def fail(self, why: str) -> None:
        self.error, self.finished, self.finish_reason = why, True, "error"
        if self.on_update is not None:
            self.on_update(self)

    def choose(self, ctx: Context, row: int) -> tuple[int, float]:
        """The next token from batch row `row` (greedy or sampled) and the greedy margin."""
        token, margin = greedy(ctx.logits(row))
        if self.sampler is not None:
            token = self.sampler.sample(ctx.ptr, row)
        return token, margin
