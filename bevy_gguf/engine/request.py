"""A request: its prompt, what it was fed, what the model predicted, and its timings."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logit at each output
    finished: bool = False
    seq: int = -1
    ttft_s: float | None = None

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

    def record(self, token: int, margin: float, is_eog: bool) -> None:
        """Take one output (prediction and margin); finish when the request is done."""
        self.tokens.append(token)
        self.margins.append(margin)
        if self.n_decoded >= self.n_steps or (self.forced is None and is_eog):
            self.finished = True
