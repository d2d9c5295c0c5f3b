"""The text workload: varied, deterministic, from the standard library and our grammars."""

from __future__ import annotations

from bevy_gguf.workload import texts as workload


def test_kinds_languages_and_lengths() -> None:
    texts = workload.texts(16, seed=0)
    assert [t.kind for t in texts[:4]] == list(workload.KINDS)
    assert len({t.text for t in texts}) == 16
    assert all(len(t.text.encode()) >= 300 for t in texts)
    multilingual = [t for t in texts if t.kind == "multilingual"]
    assert len({t.source.split()[0] for t in multilingual}) >= 3
    assert any(ord(c) > 0x400 for t in multilingual for c in t.text)
    assert any("def " in t.text for t in texts if t.kind == "code")
    assert any(sum(c.isdigit() for c in t.text) > 50 for t in texts if t.kind == "numbers")


def test_deterministic_and_seeded() -> None:
    assert workload.texts(8, seed=0) == workload.texts(8, seed=0)
    assert workload.texts(8, seed=0) != workload.texts(8, seed=1)
