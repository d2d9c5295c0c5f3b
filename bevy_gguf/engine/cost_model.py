"""What a layer-range call costs on this machine, learned from the calls it runs.

A call's compute time (its wall time minus what its layers waited for experts and the compute
gate) is modelled as

    seconds = fixed + per_layer * layers + per_token_layer * tokens * layers
              + per_expert * experts + per_context_layer * context * layers
              + per_two_pass_layer * two_pass_layers + per_load_beside * loads_beside

with `experts` the distinct experts its layers read (summed over them), `context` the
positions its tokens attend to, `two_pass_layers` its MoE layers computed in two passes
(patch 0004), and `loads_beside` the expert loads (any lane's) that landed while it computed.
The two-pass weight is what a second pass costs where it runs for real: the start-up
calibration times it with every expert resident, so its second pass has nothing to compute
(33 us a layer where calls with real second passes computed about 470 us a layer more: default
model, 90% cache, 2 threads). The loads feature is there because on a link that copies through
the CPU each load takes compute from the call it lands beside (the calibration's contention_s),
and second passes run mostly while loads move: without it the fit put the loads' cost on the
second passes (0.3-6 ms a two-pass layer against the calibration's 21-172 us, session 17),
priced so high that a second pass would never pay where only the expected loads speak for it
(plan.two_pass_pays). Every weight is a cost, so none is negative: the fit is a
non-negative least squares (Lawson-Hanson) on the calls seen, older calls forgotten
exponentially, so it follows the machine (its speed, its other load) as it runs. In decode the
features move together (experts and context grow with tokens x layers); an unconstrained fit
then trades one against another and gives some a negative weight (measured: per layer -1.6 ms
beside fixed +2.1 ms), which predicts nonsense for shapes it has not seen, such as the cost of
one more call. The scheduler asks the model what a group would cost before it splits it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURES = ("fixed", "per_layer", "per_token_layer", "per_expert", "per_context_layer", "per_two_pass_layer",
            "per_load_beside")
# features are scaled to be of the same order for the fit: context in thousands of positions
_SCALE = np.array([1.0, 1.0, 1.0, 1.0, 1e-3, 1.0, 1.0])
_TWO_PASS = FEATURES.index("per_two_pass_layer")
MIN_PASS_KINDS = 4  # calls of each kind (with and without second passes) before their difference is fitted
FORGETTING = 0.995       # per observation: the fit's memory is about 200 calls
MIN_OBSERVATIONS = 8     # before that, predictions use the mean time per token-layer seen
REFIT_EVERY = 16         # observations between two solves once the fit has settled (a solve: ~0.1 ms)
_RIDGE = 1e-9            # relative to the Gram matrix's trace: keeps an unobserved feature's solve finite


@dataclass(frozen=True, slots=True)
class CallShape:
    """What a call computes."""

    layers: int   # layers whose experts it computes
    tokens: int
    experts: int  # distinct experts read, summed over its layers
    context: int  # positions its tokens attend to, summed over its tokens
    two_pass_layers: int = 0  # its MoE layers computed in two passes
    loads_beside: int = 0     # expert loads that landed while it computed (predictions: 0)

    def features(self) -> np.ndarray:
        return _SCALE * np.array([1.0, self.layers, self.tokens * self.layers, self.experts,
                                  self.context * self.layers, self.two_pass_layers, self.loads_beside])


def nnls_gram(gram: np.ndarray, rhs: np.ndarray, start: np.ndarray | None = None,
              max_iter: int | None = None) -> np.ndarray:
    """argmin over w >= 0 of |Xw - y|^2 given X'X (gram) and X'y (rhs): Lawson-Hanson's active
    set, started from the support of `start` (the last solution) when that one still solves."""
    n = len(rhs)
    gram = gram + _RIDGE * max(np.trace(gram), 1e-30) * np.eye(n)
    w = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    if start is not None and (start > 0).any():
        support = start > 0
        s = np.linalg.solve(gram[np.ix_(support, support)], rhs[support])
        if (s > 0).all():  # a warm start: the usual case, one solve and one gradient check
            w[support], passive = s, support
    tol = 1e-12 * max(float(np.abs(rhs).max(initial=0.0)), 1e-30)
    for _ in range(max_iter or 3 * n):
        grad = rhs - gram @ w
        free = ~passive & (grad > tol)
        if not free.any():
            break
        passive[np.argmax(np.where(free, grad, -np.inf))] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.solve(gram[np.ix_(passive, passive)], rhs[passive])
            if (s[passive] > 0).all():
                w = s
                break
            shrink = passive & (s <= 0)  # step from w toward s until the first weight hits zero
            alpha = float(np.min(w[shrink] / (w[shrink] - s[shrink])))
            w = w + alpha * (s - w)
            passive &= w > tol
            w[~passive] = 0.0
    return w


class CallCostModel:
    """Online non-negative least-squares fit of a call's compute seconds on its shape."""

    def __init__(self, forgetting: float = FORGETTING) -> None:
        n = len(FEATURES)
        self.forgetting = forgetting
        self.w = np.zeros(n)
        self._gram = np.zeros((n, n))  # sum of forgetting^age * x x'
        self._rhs = np.zeros(n)        # sum of forgetting^age * x * seconds
        self.n = 0
        self._fitted_n = 0
        self._token_layers = 0.0  # for the early fallback
        self._seconds = 0.0
        self._pass_kinds = [0, 0]  # calls seen without and with second passes

    def observe(self, shape: CallShape, seconds: float) -> None:
        """One call of this shape computed for this long."""
        if seconds <= 0 or shape.layers <= 0 or shape.tokens <= 0:
            return
        x = shape.features()
        self._gram = self.forgetting * self._gram + np.outer(x, x)
        self._rhs = self.forgetting * self._rhs + x * seconds
        self.n += 1
        self._pass_kinds[shape.two_pass_layers > 0] += 1
        self._token_layers += shape.tokens * shape.layers
        self._seconds += seconds

    def _fit(self) -> np.ndarray:
        """The weights, solved again when enough calls came in since the last solve."""
        if self.n != self._fitted_n and (self.n - self._fitted_n >= REFIT_EVERY or self.n < 4 * MIN_OBSERVATIONS):
            self.w = nnls_gram(self._gram, self._rhs, start=self.w)
            self._fitted_n = self.n
        return self.w

    def predict(self, shape: CallShape) -> float | None:
        """Seconds a call of this shape would compute (None: nothing observed yet)."""
        if self.n == 0:
            return None
        fallback = self._seconds / self._token_layers * shape.tokens * shape.layers
        if self.n < MIN_OBSERVATIONS:
            return fallback
        value = float(shape.features() @ self._fit())
        return value if value > 0 else fallback

    def call_overhead(self) -> float | None:
        """What one more call costs beyond the work in it (fixed + per layer; None: not fitted yet)."""
        if self.n < MIN_OBSERVATIONS:
            return None
        w = self._fit()
        return float(w[0] + w[1])

    def two_pass_overhead(self) -> float | None:
        """What computing a MoE layer in two passes adds to a call, as fitted on this lane's calls
        (None: not enough calls of both kinds to tell it from the rest)."""
        if self.n < MIN_OBSERVATIONS or min(self._pass_kinds) < MIN_PASS_KINDS:
            return None
        return float(self._fit()[_TWO_PASS] * _SCALE[_TWO_PASS])

    def as_dict(self) -> dict[str, float | int | None]:
        """The fitted weights in seconds per unit (context per position), the calls seen, and the
        second pass's cost where calls of both kinds tell it (None: not yet)."""
        w = self._fit() if self.n >= MIN_OBSERVATIONS else self.w
        return {name: float(v * s) for name, v, s in zip(FEATURES, w, _SCALE)} | {
            "calls": self.n, "two_pass_overhead": self.two_pass_overhead()}


class LinkTimePerLoad:
    """Link seconds per expert load, lately: link busy time over loads completed, from the
    cache's running totals, a moving average weighted per load (each load moves it by 1 - decay
    of the way). So it says what a load costs as loads came: a lone load's latency when they
    come one at a time, bytes over bandwidth when they queue (a job's own time says neither:
    on a shared link it grows with the jobs beside it)."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self.value: float | None = None
        self._seen = (0, 0)

    def update(self, busy_ns: int, loads: int) -> float | None:
        """Take the cache's totals (link busy ns, loads); the estimate (None: no load yet)."""
        d_busy, d_loads = busy_ns - self._seen[0], loads - self._seen[1]
        if d_loads > 0:
            sample = d_busy / 1e9 / d_loads
            alpha = 1.0 - self.decay ** d_loads
            self.value = sample if self.value is None else self.value + alpha * (sample - self.value)
            self._seen = (busy_ns, loads)
        return self.value
