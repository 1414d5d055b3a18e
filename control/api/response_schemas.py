"""HTTP shapes of what the server answers: OpenAI's completion and chat completion
responses and stream chunks (logprobs included), the model list, OpenAI's error body, and
the `batchpilot` extension object. The requests are in control/api/schemas.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timing(BaseModel):
    """Seconds, from the engine's record of the request; None for a phase never reached."""

    queue_delay_s: float | None = None
    ttft_s: float | None = None
    prefill_time_s: float | None = None
    decode_time_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None


class SLOTargets(BaseModel):
    """The SLO of the request's lane when it was admitted (engine/config/slo.py); None: no
    target. Clients count goodput by it (batchpilot loadtest does, unless told others)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


class BatchpilotInfo(BaseModel):
    """The `batchpilot` extension object of every response and of the last stream chunk."""

    request_id: str
    lane: str
    tenant: str
    priority: int
    finish_reason: str | None = None
    finish_detail: str = ""
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    timing: Timing = Field(default_factory=Timing)
    usage: Usage | None = None  # in stream chunks, whatever include_usage says
    slo: SLOTargets | None = None  # the lane's targets; None: the lane has none
    # request fields this server ignored (outside the OpenAI and vLLM shapes), each with the
    # field it was probably meant to be: control/api/field_policy.py
    ignored_fields: list[str] = Field(default_factory=list)


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape; with echo the prompt's tokens come first."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # vLLM's


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    batchpilot: BatchpilotInfo | None = None
    error: dict[str, Any] | None = None  # stream chunks only: why a stream ended early


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None = None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # vLLM's
    usage: Usage
    batchpilot: BatchpilotInfo


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    batchpilot: BatchpilotInfo | None = None
    error: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "batchpilot"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
