"""vLLM's own endpoints, so tools written for a vLLM server work against this one unchanged:

    GET  /health      200, empty body, while the process can serve (the model loaded, the
                      engine loop alive and not stalled); else 503 saying why. Unlike
                      /readyz it stays 200 while draining, paused or failing steps: it is a
                      liveness answer (GuideLLM checks it before a run; KServe probes it).
    GET  /version     {"version": the batchpilot package version}
    POST /tokenize    {"prompt": ...} or {"messages": [...]} -> {count, max_model_len, tokens,
                      token_strs}: the ids this server's tokenizer gives (chat: through the
                      chat template, as /v1/chat/completions renders it)
    POST /detokenize  {"tokens": [...]} -> {"prompt": text}

Shapes: vllm_schemas.py. A wrong `model` is the 404 of the completion routes
(routes.serving_state); bad input is a 400 naming the field; encoding and decoding run on
the tokenizer thread, so a long input never blocks the event loop.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from control.api.body_parse import json_body, name_ignored, parse_body_naming_ignored
from control.api.errors import APIError, retry_after
from control.api.request_limits import check_messages, check_prompt_chars
from control.api.routes import ERRORS, LOADING_RETRY_AFTER_S, serving_state
from control.api.vllm_schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from control.serve.bootstrap import EngineParts
from control.serve.state import ServerState, get_state

router = APIRouter()


def package_version() -> str:
    try:
        return version("batchpilot")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def openapi_body(*models: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its own body: any of `models`, each
    schema self-contained (pydantic's `$defs` inlined: the document has no such section)."""
    schemas = []
    for model in models:
        schema = model.model_json_schema()
        schemas.append(_inlined(schema, schema.pop("$defs", {})))
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {key: _inlined(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(item, defs) for item in node]
    return node


@router.get("/health", responses={200: {"description": "serving (empty body)"}, **ERRORS})
async def health(request: Request) -> Response:
    problem = get_state(request).engine.serving_problem()
    if problem is not None:
        raise APIError(503, problem, code="not_serving",
                       headers=retry_after(LOADING_RETRY_AFTER_S))
    return Response(status_code=200)


@router.get("/version", response_model=VersionResponse)
async def version_info() -> VersionResponse:
    return VersionResponse(version=package_version())


@router.post("/tokenize", responses={200: {"model": TokenizeResponse}, **ERRORS},
             openapi_extra=openapi_body(TokenizeCompletionRequest, TokenizeChatRequest))
async def tokenize(request: Request, response: Response) -> TokenizeResponse:
    raw = await json_body(request)
    chat = isinstance(raw, dict) and "messages" in raw
    body, ignored = parse_body_naming_ignored(
        TokenizeChatRequest if chat else TokenizeCompletionRequest, raw)
    name_ignored(response, ignored)
    state = serving_state(request, body.model)
    parts = state.parts
    _check_size(state, body)
    ids, strs = await state.run_tokenizer(_encode, parts, body)
    return TokenizeResponse(count=len(ids), max_model_len=parts.static.max_model_len,
                            tokens=ids, token_strs=strs)


@router.post("/detokenize", responses={200: {"model": DetokenizeResponse}, **ERRORS},
             openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request, response: Response) -> DetokenizeResponse:
    body, ignored = parse_body_naming_ignored(DetokenizeRequest, await json_body(request))
    name_ignored(response, ignored)
    state = serving_state(request, body.model)
    max_len = state.parts.static.max_model_len
    if len(body.tokens) > max_len:  # the tokenizer thread is every request's: bound its work
        raise APIError(400, f"tokens has {len(body.tokens)} ids, more than max_model_len="
                       f"{max_len}: no sequence of this model is longer", code="invalid_value",
                       param="tokens")
    text = await state.run_tokenizer(_decode, state.parts, body.tokens)
    return DetokenizeResponse(prompt=text)


def _check_size(state: ServerState, body: TokenizeCompletionRequest | TokenizeChatRequest,
                ) -> None:
    """The generation routes' bounds, before tokenizing: a text that cannot fit the context
    is not worth the tokenizer thread's time (a million characters hold it ~1 s)."""
    limits, parts = state.settings.limits, state.parts
    if isinstance(body, TokenizeChatRequest):
        check_messages(len(body.messages), limits)
        chars, field = sum(len(m.as_template_dict()["content"]) for m in body.messages), \
            "messages"
    else:
        chars, field = len(body.prompt), "prompt"
    check_prompt_chars(chars, limits, parts.frontend_tokenizer, parts.static.max_model_len,
                       field)


# ---- on the tokenizer thread ----------------------------------------------------------------
def _encode(parts: EngineParts, body: TokenizeCompletionRequest | TokenizeChatRequest,
            ) -> tuple[list[int], list[str] | None]:
    tokenizer = parts.frontend_tokenizer
    chat = isinstance(body, TokenizeChatRequest)
    text = _render_chat(tokenizer, body) if chat else body.prompt
    ids = list(tokenizer.encode(text, add_special_tokens=body.add_special_tokens))
    strs = list(tokenizer.convert_ids_to_tokens(ids)) if body.return_token_strs else None
    return ids, strs


def _render_chat(tokenizer: Any, body: TokenizeChatRequest) -> str:
    """The conversation through the model's chat template, as /v1/chat/completions renders
    it (state.encode_chat) when add_generation_prompt is true and the rest are defaults."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "this model has no chat template; tokenize a prompt instead",
                       code="no_chat_template", param="messages")
    messages = [m.as_template_dict() for m in body.messages]
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message)
    except Exception as exc:  # the template rejects this conversation (e.g. roles)
        raise APIError(400, f"the chat template rejected the messages: {exc}",
                       code="invalid_value", param="messages") from None


def _decode(parts: EngineParts, tokens: list[int]) -> str:
    """The text of `tokens`; every id must be in the model's vocabulary."""
    bad = [t for t in tokens if not 0 <= t < parts.vocab_size]
    if bad:
        raise APIError(400, f"tokens must be token ids in 0..{parts.vocab_size - 1};"
                       f" got {bad[:5]}", code="invalid_value", param="tokens")
    try:
        return parts.frontend_tokenizer.decode(tokens)
    except Exception as exc:  # an id the model has but its tokenizer does not (padding)
        raise APIError(400, f"tokens could not be decoded: {exc}", code="invalid_value",
                       param="tokens") from None
