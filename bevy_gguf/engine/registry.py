"""The schedulers: each is a policy over one of three runners; adding one touches no runner.

| scheduler | runner | policy |
|---|---|---|
| blocking | batched: one context, every running sequence per step | stall on every miss (stock's behaviour) |
| prefetch | batched | blocking + load the experts layer il+1's router predicts from layer il's input |
| bevy-ctx | contexts: one per request, on its thread | runahead: blocked ones wait, others compute, lagging first |
| bevy | layers: lanes of layer-range calls | self-balancing: ready requests grouped per layer, lagging first |

bevy and bevy-ctx also compute each MoE layer in two passes by default (`two_pass`): the experts
that are loaded while the missing ones load, then those (patch 0004); blocking and prefetch keep
llama.cpp's one pass, which stalls the whole layer on a missing expert.
"""

from __future__ import annotations

from dataclasses import dataclass

from bevy_gguf.errors import BevyError


@dataclass(frozen=True, slots=True)
class Scheduler:
    name: str
    runner: str            # "batched", "contexts" or "layers"
    summary: str           # one line, for help texts
    prefetch: bool = False
    two_pass: bool = False  # its default for two_pass="auto"


SCHEDULERS = {s.name: s for s in (
    Scheduler("bevy", "layers", "requests grouped per layer (layer-range decode), the ready ones run ahead, "
                                "loads for the lagging first", two_pass=True),
    Scheduler("bevy-ctx", "contexts", "a context per request on its own thread: blocked ones wait, the others "
                                      "compute, lagging first", two_pass=True),
    Scheduler("prefetch", "batched", "blocking + the next layer's experts predicted by its router", prefetch=True),
    Scheduler("blocking", "batched", "one batched context that stalls on every miss (as stock llama.cpp)"),
)}
DEFAULT_SCHEDULER = "bevy"
# the arch builders patches 0003, 0005, 0006, 0009 and 0012 give layer-range decode (general.architecture;
# Mixtral is llama's): any other builder runs every layer of a call, so a partial range would abort on its assertion
LAYER_RANGE_ARCHS = ("qwen3moe", "qwen2moe", "llama", "glm4moe", "gpt-oss", "deepseek2", "qwen35moe")
LAYER_RANGE_FALLBACK = "bevy-ctx"  # what runs instead: the same runahead, a context per request


def scheduler_names() -> tuple[str, ...]:
    return tuple(SCHEDULERS)


def get_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise BevyError(f"unknown scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]


def runnable_scheduler(name: str, arch: str) -> tuple[Scheduler, str | None]:
    """The scheduler that runs `name` on a model of this arch, and why it is another (None: it
    is the one asked for): bevy needs layer-range decode, which not every arch builder has."""
    asked = get_scheduler(name)
    if asked.runner != "layers" or arch in LAYER_RANGE_ARCHS:
        return asked, None
    return get_scheduler(LAYER_RANGE_FALLBACK), (
        f"--scheduler {name} needs layer-range decode, which llama.cpp's {arch} builder does not have yet "
        f"(patched: {', '.join(LAYER_RANGE_ARCHS)}): running {LAYER_RANGE_FALLBACK} instead")


def help_text() -> str:
    """`--scheduler`'s help: every scheduler and what it does."""
    return "; ".join(f"{s.name}: {s.summary}" for s in SCHEDULERS.values()) + f" (default {DEFAULT_SCHEDULER})"
