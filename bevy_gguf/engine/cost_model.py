"""What a layer-range call costs on this machine, learned from the calls it runs.

A call's compute time (its wall time minus what its layers waited for experts and the compute
gate) is modelled as

    seconds = fixed + per_layer * layers + per_token_layer * tokens * layers
              + per_expert * experts + per_context_layer * context * layers

with `experts` the distinct experts its layers read (summed over them) and `context` the
positions its tokens attend to. The weights are fitted online by recursive least squares with
a forgetting factor, so they follow the machine (its speed, its other load) as it runs; the
scheduler asks the model what a group would cost before it decides to split it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURES = ("fixed", "per_layer", "per_token_layer", "per_expert", "per_context_layer")
# features are scaled to be of the same order for the fit: context in thousands of positions
_SCALE = np.array([1.0, 1.0, 1.0, 1.0, 1e-3])
FORGETTING = 0.995       # per observation: the fit's memory is about 200 calls
MIN_OBSERVATIONS = 8     # before that, predictions use the mean time per token-layer seen


@dataclass(frozen=True, slots=True)
class CallShape:
    """What a call computes."""

    layers: int   # layers whose experts it computes
    tokens: int
    experts: int  # distinct experts read, summed over its layers
    context: int  # positions its tokens attend to, summed over its tokens

    def features(self) -> np.ndarray:
        return _SCALE * np.array([1.0, self.layers, self.tokens * self.layers, self.experts,
                                  self.context * self.layers])


class CallCostModel:
    """Online least-squares fit of a call's compute seconds on its shape."""

    def __init__(self, forgetting: float = FORGETTING) -> None:
        n = len(FEATURES)
        self.forgetting = forgetting
        self.w = np.zeros(n)
        self.p = np.eye(n) * 1e3
        self.n = 0
        self._token_layers = 0.0  # for the early fallback
        self._seconds = 0.0

    def observe(self, shape: CallShape, seconds: float) -> None:
        """One call of this shape computed for this long."""
        if seconds <= 0 or shape.layers <= 0 or shape.tokens <= 0:
            return
        x = shape.features()
        px = self.p @ x
        gain = px / (self.forgetting + x @ px)
        self.w = self.w + gain * (seconds - x @ self.w)
        self.p = (self.p - np.outer(gain, px)) / self.forgetting
        self.n += 1
        self._token_layers += shape.tokens * shape.layers
        self._seconds += seconds

    def predict(self, shape: CallShape) -> float | None:
        """Seconds a call of this shape would compute (None: nothing observed yet)."""
        if self.n == 0:
            return None
        if self.n < MIN_OBSERVATIONS:
            return self._seconds / self._token_layers * shape.tokens * shape.layers
        fallback = self._seconds / self._token_layers * shape.tokens * shape.layers
        value = float(shape.features() @ self.w)
        return value if value > 0 else fallback

    def call_overhead(self) -> float | None:
        """What one more call costs beyond the work in it (fixed + per layer; None: not fitted yet)."""
        if self.n < MIN_OBSERVATIONS:
            return None
        return max(0.0, float(self.w[0] + self.w[1]))

    def as_dict(self) -> dict[str, float | int]:
        """The fitted weights in seconds per unit (context per position), and the calls seen."""
        return {name: float(w * s) for name, w, s in zip(FEATURES, self.w, _SCALE)} | {"calls": self.n}
