"""Offload settings from the command line: cache size (`--expert-cache`) and link (`--link`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bevy_gguf.errors import BevyError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_cache_size(text: str, expert_bytes: int) -> int:
    """`25%` (of the routed expert bytes), `512MiB`, `1.5GB` or plain bytes -> bytes."""
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


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """`file`, `ram`, or `throttle:RATE[:file|ram]` (a token bucket, reported as emulated)."""

    base: str                 # file | ram
    rate: float | None = None  # bytes/s of the throttle, None for none

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        parts = text.split(":")
        if parts[0] in ("file", "ram") and len(parts) == 1:
            return cls(parts[0])
        if parts[0] == "throttle" and len(parts) in (2, 3):
            base = parts[2] if len(parts) == 3 else "file"
            if base not in ("file", "ram"):
                raise BevyError(f"--link {text}: a throttle goes over file or ram, not {base!r}")
            return cls(base, parse_rate(parts[1]))
        raise BevyError(f"--link {text}: choose file, ram, or throttle:RATE[:file|ram] (e.g. throttle:200MB/s)")
