"""Starting and stopping the server (uvicorn)."""

from __future__ import annotations

import sys

from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.server.app import create_app
from bevy_gguf.server.engine import ServingEngine
from bevy_gguf.server.types import ServerSettings


def serve(config: EngineConfig, settings: ServerSettings) -> int:
    """Serve config's engine over HTTP until interrupted; config.n_ctx is the tokens per request."""
    import uvicorn

    engine = LLMEngine(config)
    try:
        serving = ServingEngine(engine, settings.max_queued)
        app = create_app(serving, settings)
        cache = engine.cache
        print(f"bevy-gguf: serving {config.model.name} on http://{settings.host}:{settings.port}/v1 "
              f"(--parallel {config.n_parallel}, scheduler {config.scheduler}, expert cache "
              f"{cache.budget_bytes / 2**20:.1f} MiB, link: {cache.link_name})", file=sys.stderr, flush=True)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    finally:
        engine.close()
    return 0
