"""scripts/fetch_llama.py: the patch series is applied idempotently and failures name the patch."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("fetch_llama", ROOT / "scripts" / "fetch_llama.py")
fetch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fetch)


def make_patch(tmp: Path, name: str, old: str, new: str) -> Path:
    diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/f.txt", "b/f.txt")
    path = tmp / "patches" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(diff))
    return path


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tree = tmp_path / "src" / "patched"
    tree.mkdir(parents=True)
    (tree / "f.txt").write_text("one\ntwo\n")
    monkeypatch.setattr(fetch, "PATCH_DIR", tmp_path / "patches")
    return tree


def write_series(tmp_path: Path, *names: str) -> None:
    (tmp_path / "patches" / "series").write_text("".join(n + "\n" for n in names))


def test_apply_is_idempotent_and_follows_edits(tmp_path: Path, tree: Path) -> None:
    make_patch(tmp_path, "0001-x.patch", "one\ntwo\n", "one\nTWO\n")
    write_series(tmp_path, "0001-x.patch")
    fetch.apply_series(tree)
    assert (tree / "f.txt").read_text() == "one\nTWO\n"
    mtime = (tree / "f.txt").stat().st_mtime_ns
    fetch.apply_series(tree)  # unchanged series: nothing touched
    assert (tree / "f.txt").stat().st_mtime_ns == mtime
    make_patch(tmp_path, "0001-x.patch", "one\ntwo\n", "ONE\ntwo\n")  # edited patch: re-applied cleanly
    fetch.apply_series(tree)
    assert (tree / "f.txt").read_text() == "ONE\ntwo\n"


def test_a_patch_that_does_not_apply_is_named(tmp_path: Path, tree: Path) -> None:
    make_patch(tmp_path, "0002-bad.patch", "zzz\n", "yyy\n")
    write_series(tmp_path, "0002-bad.patch")
    with pytest.raises(fetch.FetchError, match="0002-bad.patch does not apply.*regenerate"):
        fetch.apply_series(tree)


def test_real_patched_tree_carries_the_series() -> None:
    applied = ROOT / "build" / "src" / "patched" / fetch.APPLIED_DIR_NAME
    series = [p.name for p in fetch.read_series()]
    assert series and sorted(p.name for p in applied.glob("*.patch")) == sorted(series)
    stock_graph = (ROOT / "build" / "src" / "stock" / "src" / "llama-graph.cpp").read_text()
    assert "moe_hook" not in stock_graph
