"""Connections that never send a request do not pile up: the request head has a deadline.

uvicorn's h11 protocol starts its keep-alive timer only after a response, so a connection that
opens and sends nothing (or a header a byte at a time) is held for ever; a few thousand of them
take every descriptor and real clients are refused. Here a connection has `head_timeout_s` from
its opening to the end of its first request head, else the server closes it (as llama-server's
and nginx's read timeouts do); between requests uvicorn's keep-alive timeout applies. And the
process may hold as many descriptors as the hard limit allows (the soft limit is often 1024).
"""

from __future__ import annotations

import asyncio
import resource

from uvicorn.protocols.http.h11_impl import H11Protocol


def head_timeout_protocol(head_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose first request head is not in after
    head_timeout_s seconds."""

    class HeadTimeoutProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(head_timeout_s, self._head_late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not None:  # a request began: its head is in
                self._head_timer.cancel()
                self._head_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _head_late(self) -> None:
            self._head_timer = None
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

    return HeadTimeoutProtocol


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors raised to the hard one; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16),
                                                        hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
