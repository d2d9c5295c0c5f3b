"""One EngineConfig holds everything a run needs; the CLI, `Llama` and the server build it.

Values are checked when the config is made (`__post_init__`), each failure a BevyError that
names the setting and the fix; what depends on the model (the cache size of `25%`) is resolved
when the engine opens it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bevy_gguf.errors import BevyError

ENGINES = ("bevy", "stock")
EVICTIONS = ("next-use", "lru", "random")
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # LLAMA_FLASH_ATTN_TYPE_*
# llama.cpp's -lm/--load-mode values (llama_load_mode)
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}
TWO_PASS = ("auto", "on", "off")
RUNAHEAD = ("auto", "on", "off")
PREFILL_FIRST = ("auto", "on", "off")
RESIDENT_STEPS = ("rare-misses", "all-in")  # bevy: when a step skips the plan (_Lane._whole_step)
LANE_CLOCKS = ("relative", "own")  # bevy with lanes: the step of their load priorities (_Lane._priority_step)
# off: in a steady serving stream runahead loaded 1.5x blocking's bytes and auto's epochs, which
# credit runahead with work the epochs after it pay for, ran it a third of the time (docs/architecture.md)
DEFAULT_RUNAHEAD = "off"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def physical_cores() -> int:
    """Physical cores this process may run on (llama.cpp's default thread count): one per set
    of hyper-thread siblings among the CPUs of its affinity mask."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
            cores.add(Path(path).read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def parse_cache_size(text: str, expert_bytes: int) -> int:
    """`25%` (of expert_bytes: the routed experts' bytes, or the cache's memory for every one of
    them), `512MiB`, `1.5GB` or plain bytes -> bytes."""
    t = text.strip()
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise BevyError(f"--expert-cache {text}: a percentage must lie in (0, 100]")
        return int(expert_bytes * pct / 100)
    m = _SIZE.match(t)
    if not m or m.group(2).lower() not in _UNITS:
        raise BevyError(f"--expert-cache {text}: give a percentage of the expert bytes (25%) or a size (512MiB, 2GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_rate(text: str) -> float:
    """`200MB/s`, `2GB/s` (decimal units) -> bytes per second."""
    m = _SIZE.match(text.removesuffix("/s").removesuffix("/S"))
    unit = m.group(2).lower() if m else ""
    if not m or not text.lower().endswith("/s") or unit not in _UNITS or "i" in unit:
        raise BevyError(f"link rate {text!r}: write it like 200MB/s or 2GB/s (decimal units)")
    rate = float(m.group(1)) * _UNITS[unit]
    if rate <= 0:
        raise BevyError(f"link rate {text!r} must be positive")
    return rate


FAULT_KEYS = ("error-every", "short-every", "stall-every", "stall")
FAULT_SYNTAX = "fault:error-every=N,short-every=N,stall-every=N,stall=SECONDS[:file|ram] (any of them)"


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """`file`, `ram`, `throttle:RATE[:file|ram]` (a token bucket, reported as emulated), or
    `fault:...` (injected read errors, short reads and stalls for tests, reported as such)."""

    base: str                 # file | ram
    rate: float | None = None  # bytes/s of the throttle, None for none
    faults: tuple[tuple[str, float], ...] = ()  # (FAULT_KEYS entry, value) of a fault link

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        parts = text.split(":")
        if parts[0] in ("file", "ram") and len(parts) == 1:
            return cls(parts[0])
        if parts[0] in ("throttle", "fault") and len(parts) in (2, 3):
            base = parts[2] if len(parts) == 3 else "file"
            if base not in ("file", "ram"):
                raise BevyError(f"--link {text}: a {parts[0]} goes over file or ram, not {base!r}")
            if parts[0] == "fault":
                return cls(base, faults=_parse_faults(text, parts[1]))
            return cls(base, parse_rate(parts[1]))
        raise BevyError(f"--link {text}: choose file, ram, or throttle:RATE[:file|ram] (e.g. throttle:200MB/s)")

    def fault_plan(self) -> dict[str, float]:
        """The fault link's settings, as bevy_link_fault_new takes them."""
        given = dict(self.faults)
        return {"error_every": int(given.get("error-every", 0)), "short_every": int(given.get("short-every", 0)),
                "stall_every": int(given.get("stall-every", 0)), "stall_s": given.get("stall", 0.0)}


def _parse_faults(text: str, plan: str) -> tuple[tuple[str, float], ...]:
    faults = []
    for item in plan.split(","):
        key, _, value = item.partition("=")
        try:
            number = float(value) if key == "stall" else int(value)
        except ValueError:
            number = -1
        if key not in FAULT_KEYS or number < 0 or (key != "stall" and number == 0):
            raise BevyError(f"--link {text}: {item!r} is not a fault; write {FAULT_SYNTAX}")
        faults.append((key, float(number)))
    keys = [k for k, _ in faults]
    if ("stall" in keys) != ("stall-every" in keys):
        raise BevyError(f"--link {text}: a stall needs both stall-every=N and stall=SECONDS")
    return tuple(faults)


EVERY_LAYER = 1 << 16  # n_cpu_moe for llama.cpp's --cpu-moe: more layers than any model has


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one engine needs. `engine="stock"` runs unpatched llama.cpp (one context,
    n_parallel sequences per batch) and ignores the offload settings."""

    model: Path
    engine: str = "bevy"                 # bevy | stock
    scheduler: str = "bevy"              # see engine/registry.py
    n_parallel: int = 8                  # sequences decoded at once
    n_threads: int = field(default_factory=physical_cores)
    n_ctx: int | None = None             # tokens per sequence (prompt + output); None: sized to the requests
    flash_attn: str = "auto"             # auto | on | off (llama.cpp's -fa)
    expert_cache: str = "25%"            # a share of the routed expert bytes, or a size
    link: str = "file"                   # file | ram | throttle:RATE[:file|ram]
    eviction: str = "next-use"
    link_workers: int = 4                # upload threads
    wait_timeout_s: float = 300.0        # a decode waiting longer for experts fails
    seed: int = 0                        # of the random eviction policy
    lanes: int = 0                       # bevy: contexts the sequences are split into, each on its own share of
                                         # the threads (0: 1, 2, 4, ... up to one per thread, as measured at start)
    split_factor: float = 1.0            # bevy: a group waits for a flight whose loads land within this many
                                         # times its predicted compute (0: run whatever is ready)
    load_budget: float = 1.0             # bevy: distinct experts the flights past the front may have loading or
                                         # held, in expected unions of one batched layer visit (0: the cache)
    two_pass: str = "auto"               # auto | on | off: a MoE layer computes its loaded experts while the
                                         # others load (auto: bevy and bevy-ctx; blocking and prefetch stand
                                         # for llama.cpp's stall on a missing expert)
    runahead: str = DEFAULT_RUNAHEAD     # bevy: auto | on | off: flights whose experts are in run ahead (auto:
                                         # on or off, whichever decodes faster, measured as it runs)
    prefill_wave: int = 16               # bevy: prompt chunks that prefill together, layer-major (their layers'
                                         # experts load once for the wave; 1: chunk after chunk)
    prefill_first: str = "auto"          # bevy: a prompt's last wave runs before the decode tokens that wait to
                                         # start a step (on: blocking's and llama-server's order; off: they ride
                                         # with it; auto: first while they would miss under one expert a step)
    lane_clock: str = "relative"         # bevy with lanes: the step part of a load's priority is a token's progress
                                         # past its own lane's clock (the lanes' lagging tokens tie and go by
                                         # layer); own: the lane's clock, which the other lanes do not share
    resident_steps: str = "rare-misses"  # bevy: a step runs as one whole call outside the plan where every expert
                                         # is in (all-in), or also where groups are kept whole and the lane's miss
                                         # rates expect under one miss over the step (rare-misses)
    wide_prefill: bool = False           # bevy with lanes: a call with a prompt chunk computes on every thread,
                                         # alone at the compute gate (off: on its lane's share of the threads)
    kv_unified: bool = False             # llama.cpp's -kvu: one KV stream every sequence attends over under a
                                         # mask; off (llama-server's default): a stream per sequence
    repack: bool = True                  # llama.cpp's weight repacking (-nr/--no-repack: off): stock copies
                                         # repackable weights (Q4_0, Q4_K, ... on AVX2) into memory of its own
    load_mode: str = "auto"              # llama.cpp's -lm/--load-mode of the dense weights (LOAD_MODES; none:
                                         # read into memory at load, so a file cut short while serving fails
                                         # only the expert loads it lacks); the routed experts stay the link's
    device: str | None = None            # the expert cache's slots in this ggml device's memory (CUDA0, Vulkan0,
                                         # CPU: ggml's own); None: host memory of libbevy's
    gpu_layers: int = 0                  # llama.cpp's -ngl: layers whose dense weights and KV live on the GPU
                                         # (the routed experts stay in the cache)
    n_cpu_moe: int = 0                   # stock engine: llama.cpp's --n-cpu-moe (the routed experts of the first
                                         # N layers in host memory, computed on the CPU); bevy's live in its cache

    def __post_init__(self) -> None:
        if self.load_mode not in LOAD_MODES:
            raise BevyError(f"load_mode {self.load_mode!r}: choose one of {', '.join(LOAD_MODES)}")
        from bevy_gguf.engine.registry import scheduler_names

        object.__setattr__(self, "model", Path(self.model))
        if self.engine not in ENGINES:
            raise BevyError(f"unknown engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if self.scheduler not in scheduler_names():
            raise BevyError(f"unknown scheduler {self.scheduler!r}: choose one of {', '.join(scheduler_names())}")
        if not isinstance(self.lanes, int) or isinstance(self.lanes, bool) or self.lanes < 0:
            raise BevyError(f"lanes must be an integer of at least 0 (0: measured), got {self.lanes!r}")
        for name in ("n_parallel", "n_threads", "link_workers", "prefill_wave"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise BevyError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise BevyError(f"{name} must be at least 1, got {value}")
        for name in ("gpu_layers", "n_cpu_moe"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BevyError(f"{name} must be an integer of at least 0, got {value!r}")
        if self.device is not None and (not isinstance(self.device, str) or not self.device.strip()):
            raise BevyError(f"device must be a ggml device name such as CUDA0 or CPU, got {self.device!r}")
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or self.n_ctx < 2):
            raise BevyError(f"n_ctx must be an integer of at least 2, got {self.n_ctx!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise BevyError(f"flash_attn {self.flash_attn!r}: choose one of {', '.join(FLASH_ATTN)}")
        if self.eviction not in EVICTIONS:
            raise BevyError(f"unknown eviction policy {self.eviction!r}: choose one of {', '.join(EVICTIONS)}")
        if self.two_pass not in TWO_PASS:
            raise BevyError(f"two_pass {self.two_pass!r}: choose one of {', '.join(TWO_PASS)}")
        if self.resident_steps not in RESIDENT_STEPS:
            raise BevyError(f"resident_steps {self.resident_steps!r}: choose one of {', '.join(RESIDENT_STEPS)}")
        if self.lane_clock not in LANE_CLOCKS:
            raise BevyError(f"lane_clock {self.lane_clock!r}: choose one of {', '.join(LANE_CLOCKS)}")
        if not isinstance(self.kv_unified, bool):
            raise BevyError(f"kv_unified must be true or false, got {self.kv_unified!r}")
        if self.prefill_first not in PREFILL_FIRST:
            raise BevyError(f"prefill_first {self.prefill_first!r}: choose one of {', '.join(PREFILL_FIRST)}")
        if self.runahead not in RUNAHEAD:
            raise BevyError(f"runahead {self.runahead!r}: choose one of {', '.join(RUNAHEAD)}")
        if not isinstance(self.split_factor, (int, float)) or self.split_factor < 0:
            raise BevyError(f"split_factor must be a number of at least 0, got {self.split_factor!r}")
        if not isinstance(self.load_budget, (int, float)) or self.load_budget < 0:
            raise BevyError(f"load_budget must be a number of at least 0, got {self.load_budget!r}")
        if not self.wait_timeout_s > 0:
            raise BevyError(f"the wait timeout must be positive, got {self.wait_timeout_s!r} s")
        parse_cache_size(self.expert_cache, 1 << 40)  # the syntax; the size needs the model
        LinkSpec.parse(self.link)

    @property
    def link_spec(self) -> LinkSpec:
        return LinkSpec.parse(self.link)

    @property
    def flash_attn_type(self) -> int:
        return FLASH_ATTN[self.flash_attn]

    def cache_bytes(self, expert_bytes: int) -> int:
        """The expert cache's budget for a model with expert_bytes of routed experts."""
        return parse_cache_size(self.expert_cache, expert_bytes)

    @classmethod
    def from_kwargs(cls, model: str | Path, **kwargs: Any) -> tuple[EngineConfig, dict[str, Any]]:
        """(the config of the kwargs it knows, the rest): nano-vllm's LLM(**kwargs) filtering."""
        names = {f.name for f in fields(cls)}
        mine = {k: v for k, v in kwargs.items() if k in names}
        return cls(model=Path(model), **mine), {k: v for k, v in kwargs.items() if k not in names}
