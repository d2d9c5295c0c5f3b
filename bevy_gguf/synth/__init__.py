"""Generated MoE models (`bevy-gguf make-model`), cached by their parameters."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bevy_gguf.paths import cache_dir
from bevy_gguf.synth.spec import ARCHS, DTYPES, ModelSpec
from bevy_gguf.synth.writer import write_model

__all__ = ["ARCHS", "DTYPES", "ModelSpec", "ensure_model", "make_model"]


def ensure_model(spec: ModelSpec, progress: bool = True) -> Path:
    """The cached GGUF of spec, generated on first use."""
    path = cache_dir() / "models" / f"{spec.key}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_model(spec, path, progress=progress)
    return path


def make_model(spec: ModelSpec, out: Path, progress: bool = True) -> Path:
    """Write spec's model to out (from the cache: a hard link where possible, else a copy)."""
    cached = ensure_model(spec, progress=progress)
    out = out.resolve()
    if out == cached:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        os.link(cached, tmp)
    except OSError:
        shutil.copyfile(cached, tmp)
    tmp.replace(out)
    return out
