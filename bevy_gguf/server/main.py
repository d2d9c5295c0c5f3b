"""Starting and stopping the server (uvicorn)."""

from __future__ import annotations

import sys
from pathlib import Path

from bevy_gguf.api import Llama
from bevy_gguf.server.app import create_app
from bevy_gguf.server.engine import ServingEngine
from bevy_gguf.server.types import ServerSettings


def serve(model: Path, settings: ServerSettings, n_parallel: int, expert_cache: str, scheduler: str, link: str,
          n_threads: int) -> int:
    import uvicorn

    llm = Llama(model, n_parallel=n_parallel, expert_cache=expert_cache, scheduler=scheduler, link=link,
                n_threads=n_threads, n_ctx=settings.ctx_size)
    engine = ServingEngine(llm, settings.ctx_size, settings.max_queued)
    app = create_app(engine, settings)
    print(f"bevy-gguf: serving {model.name} on http://{settings.host}:{settings.port}/v1 "
          f"(--parallel {n_parallel}, scheduler {scheduler}, expert cache {llm.cache.budget_bytes / 2**20:.1f} MiB, "
          f"link: {llm.cache.link_name})", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    finally:
        engine.shutdown()
        llm.close()
    return 0
