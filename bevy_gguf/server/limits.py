"""Limits on what a request may be, checked before anything parses it (an ASGI middleware).

A head with more than MAX_HEADERS headers or more than MAX_HEAD_BYTES of them is answered 431
(h11 bounds only a head that arrives in pieces; one that arrives whole passed at any size). h11
buffers a head arriving in pieces up to BUFFERED_HEAD_BYTES (the server's
h11_max_incomplete_event_size), so that such a head reaches this check too: at h11's default of
16 KiB, uvicorn closed the connection while the client was still sending the head, and the
client got a reset instead of an answer (measured: a 64 KiB header sent in 4 KiB pieces, and now
and then test_oversized_request_heads_are_refused_and_the_server_stays under load).
A body over `max_bytes` is answered 413 (by its Content-Length before it is read, or as soon as
the bytes read pass the limit); JSON nested deeper than `max_depth` is answered 400 (Python's
parser would recurse into it and fail with a server error). Every answer has OpenAI's error shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from bevy_gguf.server.types import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# a JSON string (escapes included) as one token, or a bracket: depth counts brackets outside strings
MAX_HEADERS = 100          # as llama-server's cpp-httplib
MAX_HEAD_BYTES = 32 * 2**10
BUFFERED_HEAD_BYTES = 4 * MAX_HEAD_BYTES  # beyond it, a head in pieces is cut off (uvicorn's 400 and close)

_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def json_depth(body: bytes, stop_at: int) -> int:
    """How deep the arrays and objects of body nest (the count stops once it reaches stop_at)."""
    if body.count(b"[") + body.count(b"{") < stop_at:  # fast path: too few brackets to nest that deep
        return 0
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(body):
        c = m.group()[:1]
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest >= stop_at:
                break
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


class BodyLimits:
    """Buffers a request body up to max_bytes, checks its JSON nesting, then hands it on."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            size = sum(len(k) + len(v) + 4 for k, v in headers)  # "name: value\r\n"
            if len(headers) > MAX_HEADERS or size > MAX_HEAD_BYTES:
                await self._drain(receive)
                await self._refuse(send, 431, f"the request has {len(headers)} headers of {size} bytes, the limits "
                                              f"{MAX_HEADERS} and {MAX_HEAD_BYTES}: send fewer or shorter ones")
                return
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, self._too_large(int(declared)))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, self._too_large(size, at_least=True))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if json_depth(body, self.max_depth + 1) > self.max_depth:
            await self._refuse(send, 400, f"the JSON body nests deeper than {self.max_depth} levels: flatten it")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive) -> None:
        """Read what is left of a refused request's body (up to max_bytes): closing the connection
        with bytes unread makes the kernel reset it, and the client may then lose the answer
        (measured: `Connection reset by peer` instead of the 431, now and then)."""
        size = 0
        while size <= self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _too_large(self, size: int, at_least: bool = False) -> str:
        return (f"the body is {'over ' if at_least else ''}{size} bytes, the limit {self.max_bytes}: "
                "send a shorter prompt")

    @staticmethod
    async def _refuse(send: Send, status: int, message: str) -> None:
        body = json.dumps(error_body(message, "invalid_request_error")).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
