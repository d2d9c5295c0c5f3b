"""The HTTP API: OpenAI-compatible completions and chat (streaming by SSE), models, health, metrics."""

from __future__ import annotations

import asyncio
import codecs
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bevy_gguf.engine.request import Request as EngineRequest
from bevy_gguf.engine.sampling import Sampler, SamplingParams
from bevy_gguf.server.chat import render_chat
from bevy_gguf.server.engine import SHUTTING_DOWN, ServingEngine
from bevy_gguf.server.limits import BodyLimits
from bevy_gguf.server.stops import sendable
from bevy_gguf.server.types import ChatRequest, CompletionRequest, ServerSettings, error_body

RETRY_AFTER_S = 1


class ApiError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers


def create_app(engine: ServingEngine, settings: ServerSettings) -> FastAPI:
    app = FastAPI(title="bevy-gguf", version="0.1.0")
    llm = engine.engine  # the LLMEngine: its model tokenizes
    model_id = settings.model_alias or llm.config.model.name

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.type, e.param), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = "the body is not valid JSON"
        return JSONResponse(error_body(f"{msg}" + (f" (at {where})" if where else ""), "invalid_request_error",
                                       where), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), "invalid_request_error"), status_code=e.status_code)

    async def authorized(request: Request) -> None:
        if settings.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), settings.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           "authentication_error")

    # -- requests ------------------------------------------------------------------------

    def shutting_down() -> ApiError:
        return ApiError(503, f"{SHUTTING_DOWN}: retry on another server or after it restarts", "server_error",
                        headers={"Retry-After": str(RETRY_AFTER_S)})

    def make_request(prompt: str, body: CompletionRequest | ChatRequest, extra_stop: list[str]) -> EngineRequest:
        if not prompt:
            raise ApiError(400, "the prompt is empty: give at least one character", param="prompt")
        tokens = llm.model.tokenize(prompt)
        room = settings.ctx_size - len(tokens)
        if room < 1:
            raise ApiError(400, f"the prompt has {len(tokens)} tokens, the context {settings.ctx_size}: shorten it",
                           param="prompt")
        max_tokens = body.max_tokens if body.max_tokens is not None else room
        if max_tokens > room:
            raise ApiError(400, f"max_tokens={max_tokens} goes beyond the context: at most {room} for this prompt "
                           f"({len(tokens)} tokens of {settings.ctx_size})", param="max_tokens")
        stops = ([body.stop] if isinstance(body.stop, str) else list(body.stop or [])) + extra_stop
        params = SamplingParams(**{k: v for k, v in body.sampling().items() if v is not None})
        sampler = None if params.greedy else Sampler(llm.lib, llm.model.n_vocab, params)
        return EngineRequest(prompt=prompt, prompt_tokens=tokens, max_tokens=max_tokens, sampler=sampler,
                             stop=tuple(stops), ignore_eos=body.ignore_eos)

    async def run(req: EngineRequest, http: Request | None, every_token: bool = False
                  ) -> AsyncIterator[tuple[str, str | None]]:
        """(text delta, finish reason or None) as the request decodes; cancels it if the client
        goes. Streams pass no http: Starlette closes their generator when the client goes (asking
        the connection ourselves would race its own disconnect listener). every_token: also an
        empty delta when tokens arrived whose text is held back (timings_per_token's counts)."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[None] = asyncio.Queue()
        req.on_update = lambda _: loop.call_soon_threadsafe(updates.put_nowait, None)
        if not engine.submit(req):
            if engine.draining:
                raise shutting_down()
            raise ApiError(503, "the server is busy: the request queue is full, retry later", "server_error",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        emitted = 0  # bytes of req.text_bytes sent (decoded; bytes that are not UTF-8 left out)
        counted = 0  # tokens generated when the last delta went out
        try:
            while True:
                try:
                    await asyncio.wait_for(updates.get(), timeout=0.5)
                except asyncio.TimeoutError:  # look anyway: a wakeup may race the timeout
                    if http is not None and await http.is_disconnected():
                        req.cancelled = True
                        return
                done = req.finished  # read before the text: once finished, the text is complete
                n_tokens = len(req.tokens)
                data = bytes(req.text_bytes)
                cut = sendable(data, req.stop, done)
                delta = ""
                if cut > emitted:
                    delta = decoder.decode(data[emitted:cut])
                    emitted = cut
                if delta or (every_token and n_tokens > counted and not done):
                    counted = n_tokens
                    yield delta, None
                if done:
                    if req.error == SHUTTING_DOWN and not req.tokens:
                        raise shutting_down()
                    if req.error and req.finish_reason == "error":
                        raise ApiError(500, f"decoding failed: {req.error}", "server_error")
                    yield "", req.finish_reason
                    return
        finally:
            if not req.finished:
                req.cancelled = True  # the client left, or the handler failed: free its KV and pins
            if req.sampler is not None and req.finished:
                req.sampler.close()

    async def collect(req: EngineRequest, http: Request) -> tuple[str, str | None]:
        text, finish = "", None
        async for delta, reason in run(req, http):
            text += delta
            finish = reason or finish
        return text, finish

    def timings(req: EngineRequest, body: CompletionRequest | ChatRequest) -> dict[str, Any]:
        """llama-server's per-chunk counts, where the request asks for them (timings_per_token)."""
        if not body.timings_per_token:
            return {}
        return {"timings": {"prompt_n": len(req.prompt_tokens), "predicted_n": len(req.tokens)}}

    def usage(req: EngineRequest) -> dict[str, int]:
        n = len(req.tokens) - (1 if req.finish_reason == "stop" and req.tokens and llm.model.is_eog(req.tokens[-1])
                               else 0)
        return {"prompt_tokens": len(req.prompt_tokens), "completion_tokens": n,
                "total_tokens": len(req.prompt_tokens) + n}

    def sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                async for event in events:
                    yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
            except ApiError as e:
                yield f"data: {json.dumps(error_body(e.message, e.type))}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def first_event(events: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
        """Start a stream so that a full queue or a bad request answers with a status, not a stream."""
        first = await events.__anext__()

        async def chained() -> AsyncIterator[Any]:
            yield first
            async for e in events:
                yield e

        return first, chained()

    # -- routes --------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if engine.error:
            return JSONResponse({"status": "error", "error": engine.error}, status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": int(engine.started),
                                            "owned_by": "bevy-gguf"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = []
        for name, value in engine.metrics().items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE bevy_{name} {kind}", f"bevy_{name} {value}"]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, http: Request) -> Any:
        req = make_request(body.prompt_text(), body, [])
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for delta, finish in run(req, None, body.timings_per_token):
                yield {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                       "choices": [{"text": delta, "index": 0, "logprobs": None, "finish_reason": finish}]
                       } | timings(req, body)

        if body.stream:
            _, stream = await first_event(events())
            return sse(stream)
        text, finish = await collect(req, http)
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
                "usage": usage(req)}

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat(body: ChatRequest, http: Request) -> Any:
        prompt, stops = render_chat(llm.model, body.messages_as_dicts())
        req = make_request(prompt, body, stops)
        cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())

        def chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} | timings(req, body)

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for delta, finish in run(req, None, body.timings_per_token):
                yield chunk({"content": delta} if delta else {}, finish)

        if body.stream:
            _, stream = await first_event(events())

            async def with_role() -> AsyncIterator[dict[str, Any]]:
                yield chunk({"role": "assistant"}, None)
                async for e in stream:
                    yield e

            return sse(with_role())
        text, finish = await collect(req, http)
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": usage(req)}

    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, max_depth=settings.max_json_depth)
    return app
