"""The expert cache on a ggml device (patch 0008, engine/device_slots.py), over ggml's own CPU
device: the same path a GPU's slots take (a device buffer, copies through
ggml_backend_tensor_set), testable without one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from conftest import PROMPTS, compare_by_margin_rule, probe_logits, run_cli, run_json, stock_alone, tiny_spec

from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.device_slots import find_device
from bevy_gguf.errors import BevyError
from bevy_gguf.synth import ensure_model

N_TOKENS = 8


@pytest.mark.parametrize("size", ["50%", "100%"])
def test_device_slots_give_the_host_stores_logits_to_the_bit(tmp_path: Path, tiny_model: Path, size: str) -> None:
    _, host = probe_logits(tmp_path, "patched", tiny_model, "none", "--cache", size)
    result, device = probe_logits(tmp_path, "patched", tiny_model, "none", "--cache", size, "--device", "CPU")
    assert result["error"] is None and result["store"] == "CPU"
    assert result["counters"]["loads"] > 0
    assert result["staging_pinned"] == 0  # ggml's CPU device has no pinned host memory: plain staging
    assert np.array_equal(host, device)


def test_two_passes_on_the_cpu_device(tmp_path: Path, qwen3_tiny: Path) -> None:
    _, host = probe_logits(tmp_path, "patched", qwen3_tiny, "none", "--cache", "50%")
    result, device = probe_logits(tmp_path, "patched", qwen3_tiny, "none", "--cache", "50%", "--device", "CPU",
                                  "--two-pass")
    assert result["error"] is None and result["counters"]["second_pass"] > 0
    assert np.array_equal(host, device)


def test_a_slot_is_not_used_before_its_copy_completes(tmp_path: Path, qwen3_tiny: Path) -> None:
    """Every copy into a slot starts 20 ms late; a decode that read a slot before its copy was in
    would see the bytes of whatever expert it held before (or none) and other logits."""
    _, host = probe_logits(tmp_path, "patched", qwen3_tiny, "none", "--cache", "50%")
    result, late = probe_logits(tmp_path, "patched", qwen3_tiny, "none", "--cache", "50%", "--device", "CPU",
                                "--delay-writes", "0.02", "--two-pass")
    assert result["error"] is None and result["counters"]["loads"] > result["slots"]  # slots were reused
    assert np.array_equal(host, late)


def test_schedulers_on_the_cpu_device_by_the_rule() -> None:
    """bevy-ctx = stock --parallel 1 exactly, blocking unsplit = stock batched exactly, bevy by the
    margin rule, with the cache on the CPU device (docs/correctness.md); 64 experts, so 25% holds
    what 8 contexts need."""
    model = ensure_model(tiny_spec("qwen3moe", layers=4, experts=16, top_k=2), progress=False)
    args = [a for p in PROMPTS for a in ("-p", p)]
    alone = stock_alone(model, PROMPTS, N_TOKENS)
    batched = run_json("run", model, "--engine", "stock", "--parallel", "8", "-n", str(N_TOKENS), *args)
    device = ("--device", "CPU", "-n", str(N_TOKENS), *args)
    unsplit = run_json("run", model, "--scheduler", "blocking", "--expert-cache", "100%", *device)
    assert unsplit["stats"]["expert_store"] == "CPU"
    assert [r["tokens"] for r in unsplit["requests"]] == [r["tokens"] for r in batched["requests"]]
    ctx = run_json("run", model, "--scheduler", "bevy-ctx", "--expert-cache", "25%", *device)
    assert [r["tokens"] for r in ctx["requests"]] == [r["tokens"] for r in alone["requests"]]
    bevy = run_json("run", model, "--scheduler", "bevy", "--expert-cache", "25%", *device)
    compared, mismatches = compare_by_margin_rule(alone, bevy)
    assert mismatches == 0 and compared >= len(PROMPTS) * N_TOKENS // 2


def test_an_unknown_device_is_one_line_naming_what_there_is(qwen3_tiny: Path) -> None:
    proc = run_cli("run", qwen3_tiny, "-p", "hi", "-n", "2", "--device", "CUDA7", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "--device CUDA7" in line and "CPU" in line


def test_several_gpus_with_offloaded_layers_are_refused() -> None:
    devices = [("CPU", 0), ("CUDA0", 1), ("CUDA1", 1)]
    assert find_device(devices, "cuda0", 0) == ("CUDA0", 1)
    with pytest.raises(BevyError, match="over 2 devices"):
        find_device(devices, "CUDA0", 99)
    assert find_device(devices[:2], "CUDA0", 99) == ("CUDA0", 1)


def test_device_slots_too_short_for_the_tensor_are_refused(qwen3_tiny: Path) -> None:
    """llama_set_moe_cache refuses a cache tensor that would run past its device slots (one line in
    its log, -1), instead of ggml's assert."""
    import subprocess
    import sys

    from conftest import PROBES, ROOT

    code = f"""
import ctypes, sys
sys.path.insert(0, {str(PROBES)!r})
from bevy_gguf._native.loader import use_libllama
from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model
lib = use_libllama("patched")
llama_ext.set_lazy_experts(lib, True)
info = inspect_model({str(qwen3_tiny)!r})
params = ContextParams(n_ctx=64, n_batch=8, n_seq_max=1, n_threads=1)
with ExpertCache(info, 4 * 10**6, LinkSpec.parse("ram"), device="CPU", lib=lib) as cache, \\
        Model(lib, info.path) as model, Context(model, params) as ctx:
    real = llama_ext.set_moe_cache
    def short(lib_, ptr, tensors, n_slots):
        tensors[0].data += 64  # past the start: the tensor now ends past its slots
        return real(lib_, ptr, tensors, n_slots)
    llama_ext.set_moe_cache = short
    try:
        cache.attach(ctx)
    except Exception as e:
        print("refused:", e)
    cache.release_hooks()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: llama.cpp refused the expert cache" in proc.stdout


def test_a_device_cache_writes_only_through_its_writer(qwen3_tiny: Path) -> None:
    """With external slots libbevy never reads into the slots itself (they may be a GPU's): a kind
    without a writer fails its load, and with one the writer puts the expert's bytes in."""
    from types import SimpleNamespace

    from probes.repack_probe import WRITER, load_expert_0

    from bevy_gguf._native import libbevy
    from bevy_gguf._native.bevy_handles import Flights, NativeCache
    from bevy_gguf.engine.expert_cache import open_link
    from bevy_gguf.gguf_info import inspect_model

    info = inspect_model(qwen3_tiny)
    first = next(t for t in info.expert_tensors if t.layer == 0)
    nbytes = first.nbytes // first.n_expert
    expert_0 = qwen3_tiny.read_bytes()[first.offset:first.offset + nbytes]

    def cache_with(writer: int | None) -> tuple[NativeCache, ctypes.Array]:
        params = libbevy.bevy_cache_default_params()
        params.n_layer, params.n_expert, params.n_kinds, params.n_slots = info.n_layer, info.n_expert, 1, 4
        params.kind_bytes[0], params.n_workers, params.external_slots = nbytes, 1, 1
        native = NativeCache(params, open_link(info, LinkSpec.parse("ram")))
        for il in range(info.n_layer):
            native.set_source(il, 0, first.offset)
        with pytest.raises(BevyError, match="not given yet"):
            native.slot_data(0, 0)
        memory = ctypes.create_string_buffer(4 * nbytes)
        native.set_slot_data(0, 0, ctypes.addressof(memory))
        if writer is not None:
            native.set_writer(0, 0, writer, 0, 1, 1)
        return native, memory

    copy = WRITER(lambda _t, _a, _b, dst, src, n: ctypes.memmove(dst, src, n) and 0)
    given: list[ctypes.Array] = []  # a staging allocator's memory (a GPU's pinned host memory stands here)
    alloc_fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p))
    free_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    @alloc_fn
    def alloc(_user: int, nbytes: int, handle: ctypes._Pointer) -> int:
        given.append(ctypes.create_string_buffer(nbytes + 4096))
        handle[0] = len(given)
        return ctypes.addressof(given[-1]) + (-ctypes.addressof(given[-1]) % 4096)

    freed: list[int] = []
    free = free_fn(freed.append)
    for writer in (None, ctypes.cast(copy, ctypes.c_void_p).value):
        native, memory = cache_with(writer)
        native.set_staging(ctypes.cast(alloc, ctypes.c_void_p).value, ctypes.cast(free, ctypes.c_void_p).value, 0)
        try:
            loaded = load_expert_0(SimpleNamespace(native=native, flights=lambda: Flights(info.n_layer)),
                                   timeout_s=0.5 if writer is None else 10.0)
            assert loaded == (writer is not None)
            assert (expert_0 in memory.raw) == loaded
            assert native.staging_given() == (1 if loaded else 0)  # the expert was read into its memory
        finally:
            native.close()
    assert freed == [1] and expert_0 in given[0].raw


def test_the_bench_on_a_device_placement_runs_stock_as_gpu_users_do(tmp_path: Path) -> None:
    """-ngl above 0: stock-offload is llama.cpp's -ngl N -ot exps=CPU (no memory cap), and every
    bevy-gguf row's cache lives on the device named (here ggml's CPU device: on a build without
    a GPU, -ngl places nothing elsewhere, which is what the dry run of the GPU check relies on)."""
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    proc = run_cli("bench", model, "--workload", "text", "--systems", "stock-resident,stock-offload,blocking,bevy",
                   "--repeats", "1", "--steps", "3", "--expert-cache", "50%", "-ngl", "99", "--device", "CPU", "--json",
                   "--out", tmp_path)
    import json

    doc = json.loads(proc.stdout)
    rows = {r["system"]: r for r in doc["runs"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["stock-offload"]["memory_cap"] == "-ngl 99 -ot exps=CPU (--cpu-moe)"
    assert rows["blocking"]["expert_store"] == rows["bevy"]["expert_store"] == "CPU"
    assert "Placement: -ngl 99 for every system; bevy-gguf's expert cache in the memory of ggml device CPU" in \
        (tmp_path / "report.md").read_text()


def test_stock_cpu_moe_overrides_the_expert_tensors_buffers(qwen3_tiny: Path) -> None:
    """--cpu-moe / --n-cpu-moe N give llama.cpp one buffer-type override per layer (its log says
    which tensors it moved), and decode as stock does."""
    import subprocess
    import sys

    from conftest import ROOT

    code = f"""
from bevy_gguf._native.loader import use_libllama
from bevy_gguf._native.llama_handles import Model
lib = use_libllama("stock")
lib._logger.set_verbose(True)
with Model(lib, {str(qwen3_tiny)!r}, cpu_moe_layers=1):
    pass
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    moved = [line for line in proc.stderr.splitlines() if "buffer type overridden to CPU" in line]
    assert moved and all(".blk.0." in f".{line.split()[1]}" for line in moved), moved
    args = [a for p in PROMPTS[:4] for a in ("-p", p)]
    plain = run_json("run", qwen3_tiny, "--engine", "stock", "--parallel", "4", "-n", "4", *args)
    for flag in (("--cpu-moe",), ("--n-cpu-moe", "1")):
        moe = run_json("run", qwen3_tiny, "--engine", "stock", "--parallel", "4", "-n", "4", *flag, *args)
        assert [r["tokens"] for r in moe["requests"]] == [r["tokens"] for r in plain["requests"]]
