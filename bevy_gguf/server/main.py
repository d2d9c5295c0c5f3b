"""Starting and stopping the server (uvicorn): a signal drains it, a second one ends it at once."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.server.app import create_app
from bevy_gguf.server.connections import head_timeout_protocol, raise_descriptor_limit
from bevy_gguf.server.engine import ServingEngine
from bevy_gguf.server.limits import BUFFERED_HEAD_BYTES
from bevy_gguf.server.types import ServerSettings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the shutdown a service needs: the first SIGTERM or SIGINT stops
    accepting connections, answers the queued requests 503 (on_drain) and lets the running ones
    finish within the grace period (uvicorn's timeout_graceful_shutdown cancels what is left),
    after which serve() returns and the process exits 0 (uvicorn re-raises the signal instead,
    so the process died by it); a second signal exits at once."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], int]) -> None:
        super().__init__(config)
        self.on_drain = on_drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if self.should_exit:
            print(f"bevy-gguf: {name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + sig)
        queued = self.on_drain()
        print(f"bevy-gguf: {name}: draining (running requests have {self.config.timeout_graceful_shutdown:g} s; "
              f"{queued} queued answered 503; {name} again exits now)", file=sys.stderr, flush=True)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve(config: EngineConfig, settings: ServerSettings) -> int:
    """Serve config's engine over HTTP until a signal drains it; config.n_ctx is the tokens per request."""
    engine = LLMEngine(config)
    try:
        serving = ServingEngine(engine, settings.max_queued)
        app = create_app(serving, settings)
        cache = engine.cache
        print(f"bevy-gguf: serving {config.model.name} on http://{settings.host}:{settings.port}/v1 "
              f"(--parallel {config.n_parallel}, scheduler {config.scheduler}, expert cache "
              f"{cache.budget_bytes / 2**20:.1f} MiB, link: {cache.link_name})", file=sys.stderr, flush=True)
        raise_descriptor_limit()  # thousands of clients at once
        server = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                               timeout_graceful_shutdown=settings.shutdown_grace_s,
                                               http=head_timeout_protocol(settings.head_timeout_s),
                                               h11_max_incomplete_event_size=BUFFERED_HEAD_BYTES),
                                on_drain=serving.drain)
        server.run()
    finally:
        engine.close()
    print("bevy-gguf: stopped", file=sys.stderr, flush=True)
    return 0
