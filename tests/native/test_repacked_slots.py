"""patches/0007 and libbevy's slot writers: experts of the types stock repacks (Q4_0 -> q4_0_8x8
with AVX2) are written into their slots in that layout, so the cache runs stock's kernels."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROBES, ROOT, quant_spec
from probes.repack_probe import WRITER, load_expert_0

from bevy_gguf._native import libbevy as native
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model


def avx2() -> bool:
    return "avx2" in Path("/proc/cpuinfo").read_text().split()


def slots_of(cache: ExpertCache, kind: int, nbytes: int) -> list[bytes]:
    base = cache.native.slot_data(kind, 0)
    return [ctypes.string_at(base + s * nbytes, nbytes) for s in range(cache.class_slots[0])]


def test_a_writer_lays_out_its_kind_and_the_others_are_read_straight_in(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    layout = CacheLayout.of(info)
    seen = []

    @WRITER
    def reverse(ggml_type: int, ne0: int, ne1: int, dst: int, src: int, nbytes: int) -> int:
        seen.append((ggml_type, ne0, ne1, nbytes))
        ctypes.memmove(dst, ctypes.string_at(src, nbytes)[::-1], nbytes)
        return 0

    data = qwen3_tiny.read_bytes()
    with ExpertCache(info, 3 * layout.slot_bytes, LinkSpec.parse("ram")) as cache:
        cache.native.set_writer(0, 0, ctypes.cast(reverse, ctypes.c_void_p).value, 7, 64, 32)
        assert load_expert_0(cache)
        sizes = layout.layer_kind_bytes(0)
        raw = [data[layout.sources[(0, k)]:layout.sources[(0, k)] + b] for k, b in enumerate(sizes)]
        assert raw[0][::-1] in slots_of(cache, 0, len(raw[0])) and raw[0] not in slots_of(cache, 0, len(raw[0]))
        assert all(raw[k] in slots_of(cache, k, len(raw[k])) for k in range(1, len(raw)))
    assert seen == [(7, 64, 32, len(raw[0]))]


def test_a_failing_writer_never_marks_the_slot_ready(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    fail = WRITER(lambda *args: -1)
    with ExpertCache(info, 3 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram")) as cache:
        cache.native.set_writer(0, 1, ctypes.cast(fail, ctypes.c_void_p).value, 0, 1, 1)
        assert not load_expert_0(cache, timeout_s=0.5)
        assert cache.counters(0)["loads"] > 0  # tried (and retried), never ready


def test_a_writer_out_of_range_is_refused(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    with ExpertCache(info, 3 * CacheLayout.of(info).slot_bytes, LinkSpec.parse("ram")) as cache:
        assert native.bevy_cache_set_writer(cache.native.handle, info.n_layer, 0, None, 0, 1, 1) == -1
        assert "out of range" in native.last_error()


@pytest.mark.skipif(not avx2(), reason="ggml-cpu repacks Q4_0 on AVX2 (elsewhere on other CPU features)")
def test_q4_0_experts_are_repacked_as_stock_repacks_them() -> None:
    model = ensure_model(quant_spec("Q4_0", experts=16), progress=False)
    out = subprocess.run([sys.executable, str(PROBES / "repack_probe.py"), str(model)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    names = [t.name for t in inspect_model(model).expert_tensors]
    assert got["repacks_here"] == names and got["repacked"] == names  # every Q4_0 expert tensor
    for slot in got["layer0"]:
        assert slot["write_rc"] == 0 and slot["layout_differs"], slot
        assert slot["holds_repacked"] and not slot["holds_file_bytes"], slot
        assert slot["bad_size_rc"] == -1, slot  # a size that does not match the expert is refused
