"""EngineConfig: one place that validates every option, with the fix in the message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bevy_gguf.config import EngineConfig, LinkSpec, physical_cores
from bevy_gguf.errors import BevyError


def test_defaults_read_the_machine_not_a_constant() -> None:
    cfg = EngineConfig(model=Path("m.gguf"))
    assert cfg.n_threads == physical_cores()
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)
    assert (cfg.engine, cfg.scheduler, cfg.expert_cache, cfg.link) == ("bevy", "bevy", "25%", "file")


@pytest.mark.parametrize("bad,fragment", [
    ({"n_parallel": 0}, "n_parallel must be at least 1"),
    ({"n_threads": "2"}, "n_threads must be an integer"),
    ({"scheduler": "magic"}, "unknown scheduler 'magic': choose one of bevy, bevy-ctx, prefetch, blocking"),
    ({"engine": "gpu"}, "unknown engine"),
    ({"eviction": "fifo"}, "unknown eviction policy"),
    ({"expert_cache": "0%"}, "must lie in (0, 100]"),
    ({"expert_cache": "lots"}, "give a percentage"),
    ({"link": "nfs"}, "choose file, ram, or throttle"),
    ({"link": "throttle:fast"}, "write it like 200MB/s"),
    ({"link": "fault:boom=1"}, "'boom=1' is not a fault; write fault:error-every=N"),
    ({"link": "fault:error-every=0"}, "'error-every=0' is not a fault"),
    ({"link": "fault:stall=2"}, "a stall needs both stall-every=N and stall=SECONDS"),
    ({"link": "fault:error-every=5:nfs"}, "a fault goes over file or ram"),
    ({"wait_timeout_s": 0}, "wait timeout must be positive"),
    ({"n_ctx": 1}, "n_ctx must be an integer of at least 2"),
    ({"flash_attn": "yes"}, "choose one of auto, off, on"),
    ({"load_mode": "mapped"}, "load_mode 'mapped': choose one of auto, none, mmap"),
    ({"runahead": "always"}, "runahead 'always': choose one of auto, on, off"),
    ({"resident_steps": "never"}, "resident_steps 'never': choose one of rare-misses, all-in"),
    ({"load_budget": -0.5}, "load_budget must be a number of at least 0"),
    ({"gpu_layers": -1}, "gpu_layers must be an integer of at least 0"),
    ({"n_cpu_moe": True}, "n_cpu_moe must be an integer of at least 0"),
    ({"device": " "}, "device must be a ggml device name"),
])
def test_every_bad_value_is_one_clear_error(bad: dict, fragment: str) -> None:
    with pytest.raises(BevyError, match=None) as e:
        EngineConfig(model=Path("m.gguf"), **bad)
    assert fragment in str(e.value)


def test_from_kwargs_keeps_what_it_knows_and_returns_the_rest() -> None:
    cfg, rest = EngineConfig.from_kwargs("m.gguf", n_parallel=3, scheduler="blocking", verbose=True, top_p=0.5)
    assert (cfg.n_parallel, cfg.scheduler, cfg.model) == (3, "blocking", Path("m.gguf"))
    assert rest == {"verbose": True, "top_p": 0.5}
    assert cfg.cache_bytes(1000) == 250 and cfg.link_spec.base == "file" and cfg.flash_attn_type == -1


def test_fault_links_parse_to_the_native_plan() -> None:
    spec = LinkSpec.parse("fault:error-every=7,stall-every=3,stall=0.5:ram")
    assert spec.base == "ram" and spec.rate is None
    assert spec.fault_plan() == {"error_every": 7, "short_every": 0, "stall_every": 3, "stall_s": 0.5}
    assert LinkSpec.parse("fault:short-every=2").base == "file"


def test_bevy_needs_a_layer_range_builder_and_falls_back_to_bevy_ctx_elsewhere() -> None:
    from bevy_gguf.engine.registry import LAYER_RANGE_ARCHS, runnable_scheduler

    for arch in LAYER_RANGE_ARCHS:
        scheduler, note = runnable_scheduler("bevy", arch)
        assert scheduler.name == "bevy" and note is None
    for arch in ("olmoe", "qwen3next"):
        scheduler, note = runnable_scheduler("bevy", arch)
        assert scheduler.name == "bevy-ctx" and f"{arch} builder" in note and "running bevy-ctx" in note
        for other in ("bevy-ctx", "blocking", "prefetch"):  # they need no layer range
            scheduler, note = runnable_scheduler(other, arch)
            assert scheduler.name == other and note is None


def test_the_models_own_experts_stay_in_host_memory_where_they_should() -> None:
    """Stock: llama.cpp's --n-cpu-moe as given; bevy: every layer once -ngl puts any on a GPU (its
    experts are read from the cache only, never uploaded beside it), none without."""
    from bevy_gguf.engine.engine import experts_in_host_memory

    def cfg(**kw: object) -> EngineConfig:
        return EngineConfig(model=Path("m.gguf"), **kw)

    assert experts_in_host_memory(cfg(engine="stock", n_cpu_moe=3), 8) == 3
    assert experts_in_host_memory(cfg(engine="stock", n_cpu_moe=1 << 16, gpu_layers=99), 8) == 8
    assert experts_in_host_memory(cfg(engine="stock", gpu_layers=99), 8) == 0
    assert experts_in_host_memory(cfg(gpu_layers=99), 8) == 8
    assert experts_in_host_memory(cfg(gpu_layers=0, n_cpu_moe=4), 8) == 0
