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


def test_a_pruned_copy_keeps_what_the_builds_and_the_binding_need(tmp_path: Path) -> None:
    """The copy scripts/gpu_check.sh carries: the build's sources, ggml-cpu and ggml-cuda, the binding's
    Python files, a stamp naming the pinned sdist; not the docs, models, tests or other backends.
    Laid out again with --pruned, the patch series applies to it (make gpu-dry-run builds from it)."""
    import tarfile

    pin = fetch.read_pin()
    out = tmp_path / "pruned.tar.gz"
    fetch.make_pruned(fetch.fetch_sdist(pin), pin, out)
    top = pin["filename"].removesuffix(".tar.gz")
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
    vendor = f"{top}/vendor/llama.cpp/"
    for kept in ("CMakeLists.txt", "src/llama.cpp", "ggml/src/ggml-cpu/repack.cpp", "ggml/src/ggml-cuda/ggml-cuda.cu",
                 "tools/quantize/quantize.cpp", "tools/batched-bench/batched-bench.cpp", "common/common.cpp"):
        assert vendor + kept in names, kept
    assert f"{top}/llama_cpp/llama_cpp.py" in names and f"{top}/{fetch.PRUNED_STAMP}" in names
    gone = ("docs/", "models/", "tests/", "ggml/src/ggml-vulkan/")
    assert not any(n.startswith(vendor + p) for n in names for p in gone)
    assert out.stat().st_size < 16 << 20
    fetch.check_pruned(out, pin)
    with pytest.raises(fetch.FetchError, match="another sdist"):
        fetch.check_pruned(out, pin | {"sha256": "0" * 64})
    with pytest.raises(fetch.FetchError, match="not a pruned copy"):
        fetch.check_pruned(fetch.fetch_sdist(pin), pin)
    src = tmp_path / "src"
    assert fetch.extract_tree(out, pin, src / "patched", pruned=True)
    fetch.apply_series(src / "patched")
    assert (src / "patched" / fetch.APPLIED_DIR_NAME / "0008-llama-moe-device-slots.patch").exists()
