"""The data plane's endpoints: OpenAI's /v1/completions, /v1/chat/completions and
/v1/models, and the probes /healthz and /readyz.

A generation request: arrival stamped (arrival.py, before the body is read) -> validate
(schemas) -> routing metadata (request_meta) -> tokenize on the tokenizer thread (timed) ->
admit on the engine thread (reject: 400 / 429 / 503) with its arrival time and tokenize
seconds, from which its queue delay, TTFT and E2E count -> stream the events (SSE) or collect
them into one body. Nothing here blocks the event loop.

Probes. /healthz: the process answers. /readyz: 200 only when the model is loaded, the
engine loop is alive and has made progress recently (or is idle), the server is not
draining, and steps are not failing one after another (control/serve/step_health.py);
else 503 with the reason. Both bodies carry a few numbers for operators.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from control.api.arrival import arrival_time
from control.api.choices import admit_choices, choice_generations
from control.api.errors import APIError, rejection_error, retry_after, shown
from control.api.generation import ClientDisconnected, EngineUnresponsive
from control.api.logprobs_fields import with_logprobs
from control.api.openai_format import ResponseFormat, from_decision
from control.api.request_limits import (
    check_messages,
    check_prompt_chars,
    check_prompt_ids,
    check_sampling_limits,
)
from control.api.request_meta import RequestMeta, read_meta
from control.api.response_schemas import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from control.api.responses import collect, sse_response
from control.api.routed import routed_attributes
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from control.api.structured import with_grammar
from control.otel.context import link_from_headers, span_attributes
from control.serve.state import ServerState, get_state
from control.serve.streams import Submission
from engine.request import SamplingParams

router = APIRouter()
ERRORS = {code: {"model": ErrorResponse} for code in (400, 404, 429, 500, 503)}
LOADING_RETRY_AFTER_S = 5.0



async def _tokenized(state: ServerState, meta: RequestMeta, encode: Callable[..., Any],
                     *args: Any) -> tuple[RequestMeta, str | None, list[int]]:
    """`encode(*args)` on the tokenizer thread -> (meta with tokenize_s, text, token ids);
    tokenize_s counts the wait for that thread too."""
    started = time.perf_counter()
    text, ids = await state.run_tokenizer(encode, *args)
    return replace(meta, tokenize_s=time.perf_counter() - started), text, ids

@router.post("/v1/completions", responses={200: {"model": CompletionResponse}, **ERRORS})
async def completions(body: CompletionRequest, request: Request) -> Response:
    state, meta = _prepare(request, body)
    if isinstance(body.prompt, str):
        _check_prompt_chars(state, len(body.prompt), "prompt")
    else:
        check_prompt_ids(len(body.prompt), state.parts.static.max_model_len)
    meta, text, ids = await _tokenized(state, meta, state.encode_prompt, body.prompt,
                                        body.add_special_tokens)
    return await _generate(state, request, body, meta, "completion", text, ids,
                           body.max_tokens or 16)


@router.post("/v1/chat/completions",
             responses={200: {"model": ChatCompletionResponse}, **ERRORS})
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state, meta = _prepare(request, body)
    check_messages(len(body.messages), state.settings.limits)
    messages = [m.as_template_dict() for m in body.messages]
    _check_prompt_chars(state, sum(len(m["content"]) for m in messages), "messages")
    meta, text, ids = await _tokenized(state, meta, state.encode_chat, messages,
                                        body.add_special_tokens)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:  # the rest of the context (admission explains a prompt too long)
        max_tokens = max(1, state.parts.max_prompt_capacity - len(ids))
    return await _generate(state, request, body, meta, "chat", text, ids, max_tokens)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    state = get_state(request)
    max_len = state.parts.static.max_model_len if state.parts else 0
    return ModelList(data=[ModelCard(id=state.settings.model_name, created=state.started,
                                     max_model_len=max_len)])


def serving_state(request: Request, model: str | None) -> ServerState:
    """The server state, once it can serve `model` (None: the one it serves): 404 naming
    `model` for another, 503 while the model loads. Every route that takes a model checks
    it here (vllm_routes.py too), so a wrong model reads the same everywhere."""
    state = get_state(request)
    if model is not None and model not in state.model_names:
        raise APIError(404, f"the model {shown(model)} does not exist; this server serves"
                       f" {state.settings.model_name!r}", code="model_not_found",
                       param="model")
    if state.parts is None:
        reason = state.engine.health() or "the model is loading"
        raise APIError(503, reason, code="loading", headers=retry_after(LOADING_RETRY_AFTER_S))
    return state


def _prepare(request: Request, body: CompletionRequest | ChatCompletionRequest,
             ) -> tuple[ServerState, RequestMeta]:
    """The server state, once it can serve `body.model`; and the routing metadata."""
    state = serving_state(request, body.model)
    arrived = arrival_time(request, state.parts.engine.clock)
    meta = read_meta(request.headers, body.user, body.priority, now=arrived,
                     max_timeout_s=state.settings.max_request_timeout_s)
    return state, meta


def _check_prompt_chars(state: ServerState, chars: int, field: str) -> None:
    parts = state.parts
    check_prompt_chars(chars, state.settings.limits, parts.frontend_tokenizer,
                       parts.static.max_model_len, field)


def _sampling_params(body: CompletionRequest | ChatCompletionRequest, max_tokens: int,
                     vocab_size: int) -> SamplingParams:
    """The engine's parameters; a value it refuses is a 400 naming the field."""
    bias = body.logit_bias_ids
    for name, ids in (("stop_token_ids", body.stop_token_ids or ()), ("logit_bias", bias)):
        bad = sorted({t for t in ids if not 0 <= t < vocab_size})
        if bad:  # before any tensor sees them: an id outside fails the whole batch's step
            raise APIError(400, f"{name} must hold token ids in 0..{vocab_size - 1};"
                           f" got {bad[:5]}", code="invalid_value", param=name)

    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=given(body.temperature, 1.0),
            top_p=given(body.top_p, 1.0), top_k=max(0, body.top_k or 0), seed=body.seed,
            stop=body.stop_list, stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos, presence_penalty=given(body.presence_penalty, 0.0),
            frequency_penalty=given(body.frequency_penalty, 0.0),
            repetition_penalty=given(body.repetition_penalty, 1.0), logit_bias=bias,
            min_p=given(body.min_p, 0.0), min_tokens=given(body.min_tokens, 0),
            logprobs=body.engine_logprobs, prompt_logprobs=body.engine_prompt_logprobs)
    except ValueError as exc:  # the message starts with "field=..."
        field = str(exc).split("=", 1)[0]
        raise APIError(400, str(exc), code="invalid_value",
                       param=field if field.isidentifier() else None) from None


async def _generate(state: ServerState, request: Request,
                    body: CompletionRequest | ChatCompletionRequest, meta: RequestMeta,
                    kind: str, text: str | None, ids: list[int], max_tokens: int) -> Response:
    check_sampling_limits(body, state.settings.limits, max_tokens)
    params = _sampling_params(body, max_tokens, state.parts.vocab_size)
    params = await with_grammar(state, body, params)  # response_format: compiled off-thread
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    request_id = prefix + uuid.uuid4().hex
    trace = link_from_headers(request.headers, span_attributes(
        "chat" if kind == "chat" else "text_completion", state.settings, max_tokens)
        + routed_attributes(request.headers, fleet_replica=bool(state.settings.replica_name)))
    fmt = ResponseFormat(kind, request_id, state.settings.model_name, len(ids), meta,
                         include_usage=body.include_usage,
                         continuous_usage=body.continuous_usage, lane=meta.lane or "",
                         trace_id=trace.trace_id, ignored_fields=tuple(body.ignored_fields))
    await with_logprobs(state, body, fmt, text, ids)  # a 400 when the engine has none
    submission = Submission(request_id, text, ids, params, tenant=meta.tenant,
                            lane=meta.lane, priority=meta.priority, deadline=meta.deadline,
                            cache_salt=body.cache_salt, arrival_time=meta.arrival_time,
                            tokenize_s=meta.tokenize_s,
                            timeout_at=None if meta.arrival_time is None
                            else meta.arrival_time + meta.timeout_s, trace=trace,
                            resent=meta.resent)
    decision, streams = await admit_choices(state.engine, submission, body.n)  # choices.py
    from_decision(fmt, decision, state.engine.live_config)
    if not streams:
        raise rejection_error(decision, fmt.start_headers())
    state.inflight += 1
    gens, done = choice_generations(state, request, streams, timeout_s=meta.timeout_s,
                                    streaming=body.stream)
    if body.stream:
        try:
            return sse_response(gens, fmt, on_close=done)
        except BaseException:  # no response will run on_close: end the choices here
            _end(gens, done)
            raise
    try:
        return await collect(gens, fmt)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening
    except EngineUnresponsive as exc:
        raise APIError(500, str(exc), code="engine_unresponsive") from None
    finally:
        _end(gens, done)


def _end(gens: list, done: Callable[[], None]) -> None:
    """Close each choice's generation (aborting it in the engine if it still runs) and
    count the request out of `inflight`."""
    for gen in gens:
        gen.close()
    done()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = get_state(request)
    engine = state.engine
    reason = engine.health()
    stats = engine.stats
    body = {
        "status": "ready" if reason is None else "not_ready",
        "reason": reason,
        "model": state.settings.model_name,
        "draining": engine.draining,
        "inflight": state.inflight,
        "engine": {"steps": stats.steps, "last_step_s": stats.last_step_s,
                   "last_step_age_s": None if stats.last_step_at is None
                   else round(time.time() - stats.last_step_at, 3),
                   "running": stats.running, "waiting": stats.waiting,
                   "kv_blocks_used": stats.kv_blocks_used, "kv_usage": stats.kv_usage},
        "aborts": dict(engine.abort_counts),
        "rejections": dict(engine.reject_counts),
        "step_failures": engine.step_health.as_dict(),
    }
    headers = {"Retry-After": "5"} if reason is not None else None
    return JSONResponse(body, status_code=200 if reason is None else 503, headers=headers)
