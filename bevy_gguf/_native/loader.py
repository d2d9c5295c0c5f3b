"""Binds llama-cpp-python to one of our libllama builds, once per process.

llama-cpp-python resolves every symbol when `llama_cpp` is imported, from the folder named by
LLAMA_CPP_LIB_PATH. So the choice (stock or patched) is made here, before that import, and a
process keeps it: two libllamas in one process would mean two hook registries.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from bevy_gguf.errors import BevyError
from bevy_gguf.paths import lib_dir

_chosen: str | None = None


def loaded_libllama() -> list[str]:
    """Paths of every libllama mapped into this process (from /proc/self/maps)."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
            if os.path.basename(path).startswith("libllama.so"):
                paths.add(os.path.realpath(path))
    return sorted(paths)


def use_libllama(kind: str) -> ModuleType:
    """Import llama_cpp bound to the 'stock' or 'patched' libllama; the first call decides."""
    global _chosen
    if _chosen == kind:
        return sys.modules["llama_cpp"]
    if _chosen is not None:
        raise BevyError(
            f"this process already uses the {_chosen} libllama and cannot load the {kind} one: "
            f"run the {kind} engine in its own process"
        )
    if "llama_cpp" in sys.modules:
        wanted = str(lib_dir(kind).resolve())
        if not all(os.path.dirname(p) == wanted for p in loaded_libllama()):
            raise BevyError(
                f"llama_cpp was imported before bevy_gguf chose the {kind} libllama: import bevy_gguf first, "
                f"or set LLAMA_CPP_LIB_PATH={wanted} before importing llama_cpp"
            )
        _chosen = kind
        return sys.modules["llama_cpp"]
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir(kind))
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)
    llama_cpp.llama_backend_init()
    _chosen = kind
    return llama_cpp
