"""System variants for in-run A/B: `bevy:two-pass=off`, `bevy:split-factor=1000:lanes=1`, ...

A variant is a bevy-gguf system with some of its options set apart from the bench's own; it
runs interleaved with the others, repeat by repeat, so its ratio to its base system is measured
side by side (separate invocations differ by 10-25% on a shared machine). Targets judge the
plain systems only; a variant is a row of its own, named as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bevy_gguf.config import EVICTIONS, LANE_CLOCKS, PREFILL_FIRST, RESIDENT_STEPS, RUNAHEAD, TWO_PASS
from bevy_gguf.errors import BevyError

# option name in a variant -> (spec key, how its value is read)
OPTIONS: dict[str, tuple[str, Any]] = {
    "two-pass": ("two_pass", str),
    "runahead": ("runahead", str),
    "split-factor": ("split_factor", float),
    "load-budget": ("load_budget", float),
    "lanes": ("lanes", int),
    "eviction": ("eviction", str),
    "prefill-wave": ("prefill_wave", int),
    "prefill-first": ("prefill_first", str),
    "wide-prefill": ("wide_prefill", str),  # on: a lane's prompt calls on every thread; off: its share
    "kv-unified": ("kv_unified", str),  # on: one KV stream (llama.cpp's -kvu); off: one per sequence
    "link-workers": ("link_workers", int),  # upload threads: reads in flight at once
    "lane-clock": ("lane_clock", str),  # relative | own: the step of a lane's load priorities (_Lane._priority_step)
    "resident-steps": ("resident_steps", str),  # rare-misses | all-in: when a step skips the plan (_Lane._whole_step)
}


@dataclass(frozen=True, slots=True)
class SystemVariant:
    name: str                  # as written: the row's name
    base: str                  # the system it sets options of
    options: dict[str, Any]    # spec keys -> values, over the bench's own

    @property
    def is_variant(self) -> bool:
        return bool(self.options)


def base_of(name: str) -> str:
    """The system a (parsed) variant name runs: NAME of NAME:option=value..."""
    return name.split(":", 1)[0]


def parse_system(name: str, systems: tuple[str, ...], variable: tuple[str, ...]) -> SystemVariant:
    """NAME or NAME:option=value[:option=value...] (options: see OPTIONS); variable: the systems
    that take options (bevy-gguf's schedulers: stock llama.cpp has none of them)."""
    base, *parts = name.split(":")  # base_of(name) and the options
    if base not in systems:
        raise BevyError(f"unknown system {base!r} in {name!r}: choose from {', '.join(systems)}")
    if parts and base not in variable:
        raise BevyError(f"{name}: {base} takes no options (only {', '.join(variable)} do)")
    options: dict[str, Any] = {}
    for part in parts:
        key, eq, raw = part.partition("=")
        if key not in OPTIONS or not eq or not raw:
            raise BevyError(f"{name}: write options as {base}:option=value, options {', '.join(OPTIONS)}")
        spec_key, kind = OPTIONS[key]
        try:
            value = kind(raw)
        except ValueError:
            raise BevyError(f"{name}: {key}={raw} is not a number") from None
        _check(name, key, value)
        options[spec_key] = value
    return SystemVariant(name, base, options)


# options whose value is one of a few words: the words
CHOICES: dict[str, tuple[str, ...]] = {"two-pass": TWO_PASS, "runahead": RUNAHEAD, "eviction": EVICTIONS,
                                       "prefill-first": PREFILL_FIRST, "lane-clock": LANE_CLOCKS,
                                       "resident-steps": RESIDENT_STEPS}


def _check(name: str, key: str, value: Any) -> None:
    if key in CHOICES and value not in CHOICES[key]:
        raise BevyError(f"{name}: {key}={value}: choose one of {', '.join(CHOICES[key])}")
    if key in ("kv-unified", "wide-prefill") and value not in ("on", "off"):
        raise BevyError(f"{name}: {key}={value}: choose on or off")
    if key == "prefill-wave" and value < 1:
        raise BevyError(f"{name}: prefill-wave must be at least 1, got {value}")
    if key == "link-workers" and value < 1:
        raise BevyError(f"{name}: link-workers must be at least 1, got {value}")
    if key in ("split-factor", "load-budget", "lanes") and value < 0:
        raise BevyError(f"{name}: {key} must be at least 0, got {value}")
