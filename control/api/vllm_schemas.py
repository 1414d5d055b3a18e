"""vLLM's request and response shapes for /tokenize and /detokenize (as in vLLM's
`entrypoints/serve/tokenize/protocol.py`, read at its 2026 main): a body with `messages` is
a chat request, rendered through the model's chat template; any other is a completion
request. Unknown fields are ignored, as vLLM does, but named (the log and the answer's
X-Batchpilot-Ignored-Fields header: control/api/body_parse.py).

Fields vLLM accepts that this server does not implement are refused with a 400 naming them
when they carry a value: a per-request `chat_template` (running a client's Jinja template
is not something this server does), `chat_template_kwargs` and `tools` (the chat completion
route would not pass them to the template either, so the count would not match what a
generation uses), `mm_processor_kwargs` (text models only).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from control.api.list_shapes import token_ids_shape
from control.api.message_schemas import ChatMessage

UNSUPPORTED_CHAT_FIELDS = ("chat_template", "chat_template_kwargs", "tools",
                           "mm_processor_kwargs")


class _VllmRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # as the generation routes'

    model: str | None = None


class TokenizeCompletionRequest(_VllmRequest):
    prompt: str
    # NOTE: vLLM's default (BOS and the like added), kept for its clients; /v1/completions
    # encodes without them, so false counts what a completion of this prompt uses
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_VllmRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # leave the last message open (a prefill)
    add_special_tokens: bool = False  # vLLM's default: the template adds its own
    return_token_strs: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_both(cls, data: Any) -> Any:
        if isinstance(data, dict) and "prompt" in data:  # one of them would go unread
            raise ValueError("send prompt or messages, not both")
        return data

    @field_validator("continue_final_message")
    @classmethod
    def _one_ending(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("add_generation_prompt"):
            raise ValueError("cannot be true together with add_generation_prompt (the"
                             " default): send add_generation_prompt=false with it")
        return value

    @field_validator(*UNSUPPORTED_CHAT_FIELDS)
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value not in (None, [], {}):
            raise ValueError("is not supported by this server")
        return value


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # when return_token_strs


class DetokenizeRequest(_VllmRequest):
    tokens: list[int]  # also at most max_model_len (the route): no longer text comes out

    _tokens_shape = field_validator("tokens", mode="before")(token_ids_shape)


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
