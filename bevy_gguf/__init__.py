"""bevy-gguf: runahead scheduling of concurrent requests on MoE GGUF models with offloaded experts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["BevyError", "Llama"]

from bevy_gguf.errors import BevyError

if TYPE_CHECKING:
    from bevy_gguf.api import Llama


def __getattr__(name: str) -> Any:
    # imported lazily: choosing a libllama must not happen at `import bevy_gguf`
    if name == "Llama":
        from bevy_gguf.api import Llama

        return Llama
    raise AttributeError(name)
