"""Run statistics that a server keeps for weeks stay bounded."""

from bevy_gguf.engine.stats import SpanUnion, union_seconds


def test_span_union_folds_in_bounded_memory_and_keeps_the_length() -> None:
    spans = [(i * 1.0, i * 1.0 + 1.5) for i in range(0, 20000, 2)] + [(19990.5, 19995.0)]  # overlapping, late
    u = SpanUnion(keep=256, tail=16)
    for start, end in spans:
        u.add(start, end)
    assert len(u.spans) <= 257
    assert abs(u.seconds() - union_seconds(spans)) < 1e-6
