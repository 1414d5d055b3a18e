"""The edge's ASGI app: the data plane's bodies validated as the server validates them (the
same schemas, limits and error handlers, so a refusal reads the same from either process),
then forwarded; every other route forwarded as it came (the server checks its tokens).

Checked here: the body's size (413), JSON, the completions / chat / tokenize / detokenize
schemas with their list shapes and field bounds, the number of chat messages. Left to the
server: whatever needs the model (prompt length in tokens or characters, token ids against
the vocabulary, grammars) or its state (model names, tokens, queues).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from control.api.arrival import StampArrival
from control.api.body_limit import BodyLimit
from control.api.body_parse import json_body, parse_body
from control.api.errors import install_error_handlers
from control.api.limits import RequestLimits
from control.api.request_limits import check_messages
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from control.api.text_check import UnicodeBody
from control.api.vllm_schemas import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from control.edge.forward import Upstream

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_edge_app(uds: str, limits: RequestLimits) -> FastAPI:
    """The edge in front of the server listening on the Unix socket `uds`."""
    upstream: Upstream | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal upstream
        upstream = Upstream(uds)
        try:
            yield
        finally:
            await upstream.close()

    async def forward(request: Request) -> Response:
        assert upstream is not None, "the lifespan opens the upstream first"
        return await upstream.forward(request, await request.body())

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(UnicodeBody)  # inside BodyLimit: reads a body already bounded
    app.add_middleware(StampArrival)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await forward(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_messages(len(body.messages), limits)
        return await forward(request)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        raw = await json_body(request)
        chat = isinstance(raw, dict) and "messages" in raw
        body = parse_body(TokenizeChatRequest if chat else TokenizeCompletionRequest, raw,
                          warn_unknown=False)  # the server warns, once
        if chat:
            check_messages(len(body.messages), limits)
        return await forward(request)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        parse_body(DetokenizeRequest, await json_body(request), warn_unknown=False)
        return await forward(request)

    @app.api_route("/{path:path}", methods=METHODS, include_in_schema=False)
    async def anything_else(path: str, request: Request) -> Response:
        return await forward(request)

    return app
