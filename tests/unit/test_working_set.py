"""The working-set curve of a recorded order (bench/working_set.py)."""

from __future__ import annotations

from bevy_gguf.bench.working_set import working_set


def test_spans_count_the_distinct_experts_of_their_calls() -> None:
    # four decode calls of 2 tokens over one layer; a prompt chunk (0 decode tokens) in between
    calls = [(2, [(0, [1, 2])]), (0, [(0, [7])]), (2, [(0, [2, 3])]), (2, [(0, [1, 2])]), (2, [(0, [4, 5])])]
    curve = working_set(calls, n_experts=8)
    assert [w["decode_tokens"] for w in curve] == [2, 4, 8]
    two, four, eight = curve
    assert two["spans"] == 4 and two["distinct_experts"] == (2 + 3 + 2 + 2) / 4  # the chunk joins the 2nd span
    assert four["spans"] == 2 and four["distinct_experts"] == (4 + 4) / 2  # {1,2,7,3} and {1,2,4,5}
    assert eight["spans"] == 1 and eight["distinct_experts"] == 6 and eight["share"] == 6 / 8


def test_the_same_expert_at_two_layers_counts_twice_and_no_decode_gives_no_curve() -> None:
    assert working_set([(1, [(0, [3]), (1, [3])])], n_experts=4)[0]["distinct_experts"] == 2
    assert working_set([(0, [(0, [3])])], n_experts=4) == []

