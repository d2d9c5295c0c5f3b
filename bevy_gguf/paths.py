"""Where things live: the build outputs of `make build` and the cache of generated files."""

from __future__ import annotations

import os
from pathlib import Path

from bevy_gguf.errors import BevyError

REPO_ROOT = Path(__file__).resolve().parent.parent


def build_dir() -> Path:
    """The folder `make build` fills (override: BEVY_GGUF_BUILD_DIR)."""
    return Path(os.environ.get("BEVY_GGUF_BUILD_DIR", REPO_ROOT / "build"))


def lib_dir(kind: str) -> Path:
    """The folder holding libllama.so of the 'stock' or 'patched' build."""
    if kind not in ("stock", "patched"):
        raise ValueError(f"unknown libllama kind {kind!r}")
    path = build_dir() / "dist" / kind / "lib"
    if not (path / "libllama.so").exists():
        raise BevyError(f"{path / 'libllama.so'} is missing: run `make build` first")
    return path


def tool_path(name: str) -> Path:
    """A stock llama.cpp tool built by `make build` (e.g. llama-batched-bench)."""
    path = build_dir() / "dist" / "stock" / "bin" / name
    if not path.exists():
        raise BevyError(f"{path} is missing: run `make build` first")
    return path


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/bevy-gguf (default ~/.cache/bevy-gguf)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "bevy-gguf"
    path.mkdir(parents=True, exist_ok=True)
    return path
