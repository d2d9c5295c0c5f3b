"""The working-set curve of a recorded order: how many distinct experts a span of decode
tokens touches, so a reader sees how much of the cache a window of the run needs."""

from __future__ import annotations

from typing import Any

Visit = tuple[int, list[int]]  # (layer, distinct experts) of one layer of one call


def working_set(calls: list[tuple[int, list[Visit]]], n_experts: int) -> list[dict[str, Any]]:
    """calls: (decode tokens, visits) per call, in order. For spans of 2^k decode tokens (from
    the smallest call's up to the whole order), the mean distinct (layer, expert) pairs of the
    consecutive calls that make up each span (prompt chunks among them count: they touch the
    cache too), non-overlapping, and that as a share of every routed expert."""
    total = sum(t for t, _ in calls)
    smallest = min((t for t, _ in calls if t), default=0)
    if not smallest:
        return []
    out = []
    span = 1 << (smallest - 1).bit_length()
    while span <= total:
        sizes, touched, tokens = [], set(), 0
        for t, visits in calls:
            touched.update((il, e) for il, es in visits for e in es)
            tokens += t
            if tokens >= span:
                sizes.append(len(touched))
                touched, tokens = set(), 0
        mean = sum(sizes) / len(sizes)
        out.append({"decode_tokens": span, "distinct_experts": mean, "share": mean / n_experts, "spans": len(sizes)})
        span *= 2
    return out
