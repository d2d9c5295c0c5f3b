"""bevy-gguf: runahead scheduling of concurrent requests on MoE GGUF models with offloaded experts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["BevyError", "EngineConfig", "LLMEngine", "Llama"]

from bevy_gguf.errors import BevyError

if TYPE_CHECKING:
    from bevy_gguf.config import EngineConfig
    from bevy_gguf.engine.engine import LLMEngine
    from bevy_gguf.llama import Llama


def __getattr__(name: str) -> Any:
    # imported lazily: choosing a libllama must not happen at `import bevy_gguf`
    if name == "Llama":
        from bevy_gguf.llama import Llama

        return Llama
    if name == "EngineConfig":
        from bevy_gguf.config import EngineConfig

        return EngineConfig
    if name == "LLMEngine":
        from bevy_gguf.engine.engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
