"""What a run measured: decode and prefill time and tokens, the batches, the cache's counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class BatchCall:
    """One llama_decode: which request each batch row belongs to, and whether it was prefill."""

    prefill: bool
    rows: list[int]  # index into the request list, per batch row

    def output_rows(self) -> list[int]:
        """The rows that output logits: each request's last (llama.cpp's last layer computes only
        these: it drops the others before that layer's FFN)."""
        rows = self.rows
        return [n for n, i in enumerate(rows) if n == len(rows) - 1 or rows[n + 1] != i]


@dataclass(slots=True)
class RunStats:
    decode_s: float = 0.0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    calls: list[BatchCall] = field(default_factory=list)  # per call, for a run's trace (not kept when serving)
    n_calls: int = 0
    decode_counters: dict[str, float] = field(default_factory=dict)  # expert cache, decode calls only

    @property
    def tok_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def merged_spans(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[start, end) intervals merged where they overlap or touch, in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: the wall time during which any ran."""
    return sum((end - start for start, end in merged_spans(intervals)), 0.0)


@dataclass(slots=True)
class SpanUnion:
    """The union's length of [start, end) spans added as they end, in bounded memory (a server
    adds one per call for weeks): past `keep` spans, the merged ones but the last `tail` are
    folded into a total. A span that began before a folded one ended would be counted twice
    where they overlap: it would have to outlast thousands of later calls."""

    keep: int = 4096
    tail: int = 64
    folded_s: float = 0.0
    spans: list[tuple[float, float]] = field(default_factory=list)

    def add(self, start: float, end: float) -> None:
        self.spans.append((start, end))
        if len(self.spans) > self.keep:
            merged = merged_spans(self.spans)
            self.folded_s += sum(e - s for s, e in merged[: -self.tail])
            self.spans = merged[-self.tail:]

    def seconds(self) -> float:
        return self.folded_s + union_seconds(self.spans)


def hit_rate(counters: dict[str, float]) -> float:
    """Hits over lookups of an expert cache's counters (0 with no lookups)."""
    looked_up = counters.get("hits", 0) + counters.get("misses", 0)
    return counters.get("hits", 0) / looked_up if looked_up else 0.0
