"""HTTP shapes of requests: OpenAI's completions and chat completions (the answers:
control/api/response_schemas.py).

Parameters the engine cannot honour are refused with a 400 naming them, never ignored
silently: best_of, suffix, tools, and the other OpenAI
and vLLM fields in field_policy.UNIMPLEMENTED (accepted at their "off" values only).
Logprobs (chat's logprobs / top_logprobs, completions' logprobs and echo, vLLM's
prompt_logprobs) are of the raw model distribution, at most MAX_LOGPROBS alternatives. A
field outside the OpenAI and vLLM request shapes is ignored, as vLLM does, but named in the
log and in the answer (field_policy.py); so is a key outside stream_options' or a message's
shape (named stream_options.<key>, messages[].<key>).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from control.api.field_policy import merge_ignored
from control.api.list_shapes import MAX_LOGIT_BIAS as MAX_LOGIT_BIAS_ENTRIES
from control.api.list_shapes import (
    MAX_MESSAGES,
    MAX_STOP_STRINGS,
    bounded_list,
    bounded_object,
    prompt_shape,
    stop_shape,
)
from control.api.message_schemas import ChatMessage, WarnsUndeclared
from engine.logprobs import MAX_LOGPROBS
from engine.request import REPETITION_PENALTY_RANGE
from engine.structured import StructuredOutput

MAX_SEED = 2**63 - 1
MAX_CHOICES = 16  # n
MAX_CACHE_SALT_LEN = 256  # characters; a salt needs ~22 of base64 for 128 random bits
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value, either sign
MAX_STOP_TOKEN_IDS = 256  # stop_token_ids entries
MAX_TOKEN_ID_DIGITS = 12  # a logit_bias key: int() of a longer one is no vocabulary's id
_ASCII_DIGITS = re.compile(rf"[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}")


class StreamOptions(WarnsUndeclared):
    _field_path: ClassVar[str] = "stream_options."

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, usage on every chunk


class _GenerationRequest(WarnsUndeclared):
    """Fields both endpoints share. Undeclared fields: see field_policy.py."""

    _is_body: ClassVar[bool] = True

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM's -1 and 0 both mean off
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    n: int = 1  # choices: one engine request each, sharing the prompt's blocks (choices.py)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    priority: int | None = None  # vLLM's: smaller runs first
    ignore_eos: bool = False
    # vLLM's: the prefix-cache domain instead of the tenant; requests that send the same
    # salt share cached prefixes (a shared secret: see engine/kv/prefix_hash.py)
    cache_salt: str | None = None
    # logits processors (engine/execution/sampler.py); logit_bias ids are checked against the vocab
    # by the route (a 400 naming logit_bias)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(  # vLLM's; bounded so logits stay finite
        None, ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1])
    logit_bias: dict[str, float] | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # vLLM's
    min_tokens: int | None = Field(None, ge=0)  # vLLM's
    # vLLM's: each prompt token's logprob (the first has none) and N alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # JSON output by grammar (engine/structured): OpenAI's response_format, or vLLM's
    # guided_json (a schema); the schema is compiled by the route (a 400 naming the field)
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    # Accepted at their neutral values only.
    best_of: int | None = None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        seen: dict[int, str] = {}
        for token, value in (bias or {}).items():
            if not _ASCII_DIGITS.fullmatch(token.strip()):  # not isdigit(): '²' is a digit
                raise ValueError(f"keys must be token ids (non-negative integers), got {token!r}")
            if int(token) in seen:  # " 5", "05" and "5": one would silently win
                raise ValueError(f"keys {seen[int(token)]!r} and {token!r} both name token"
                                 f" {int(token)}")
            seen[int(token)] = token
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"values must be in [-100, 100], got {value!r} for {token}")
        return bias

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                # its size: limit max_schema_bytes, checked by the route before compiling
                StructuredOutput.from_openai(value, max_chars=None)
            except ValueError as exc:  # the message names response_format; the loc does too
                raise ValueError(str(exc).removeprefix("response_format").lstrip(":. ")
                                 ) from None
        return value

    @property
    def structured_output(self) -> tuple[StructuredOutput | None, str]:
        """The requested structured output (None: plain text) and the field that asked."""
        if self.guided_json is not None:
            if self.response_format not in (None, {"type": "text"}):
                raise ValueError("guided_json and response_format both ask for structured"
                                 " output: send one")
            return StructuredOutput.json_schema(self.guided_json, field_name="guided_json",
                                                max_chars=None), \
                "guided_json"
        fmt = self.response_format
        return (None if fmt is None else StructuredOutput.from_openai(fmt, max_chars=None)), \
            "response_format"

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n={n} must be in [1, {MAX_CHOICES}] (each choice is one engine"
                             " request; send several requests for more)")
        return n

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, salt: str | None) -> str | None:
        if salt is not None and not 1 <= len(salt) <= MAX_CACHE_SALT_LEN:
            raise ValueError(f"must be a non-empty string of at most {MAX_CACHE_SALT_LEN}"
                             f" characters, got {len(salt)} characters")
        return salt

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, stop: Any) -> Any:
        return stop_shape(stop)  # counted and typed before the union tries its items

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias_size(cls, bias: Any) -> Any:
        return bounded_object(bias, MAX_LOGIT_BIAS_ENTRIES, "logit_bias entries")

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        return stop

    @model_validator(mode="after")
    def _neutral_only(self) -> _GenerationRequest:
        for name, neutral in self._neutral_values().items():
            value = getattr(self, name, None)
            if value not in (None, neutral, False) and value != {}:
                raise ValueError(f"{name}={value!r} is not supported by this server")
        return self

    def _neutral_values(self) -> dict[str, Any]:
        return {"best_of": 1}

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        return {int(token): value for token, value in (self.logit_bias or {}).items()}

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def ignored_fields(self) -> list[str]:
        """The undeclared fields this request's answer names (field_policy.py), nested
        objects' by their path; at most MAX_NAMED, then a count."""
        return merge_ignored(self._ignored, *(part._ignored for part in self._parts()))

    def _parts(self) -> list[WarnsUndeclared]:
        """The objects nested in this body that rule on their own undeclared fields."""
        return [self.stream_options] if self.stream_options else []

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats (GuideLLM asks for it): every chunk
        carries the usage so far; it needs include_usage, as in vLLM."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # the reply starts with the prompt (and its logprobs, when asked)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # N alternatives per token
    suffix: str | None = None
    # vLLM's: a text prompt gets the tokenizer's special tokens (a BOS, for the models
    # whose tokenizer adds one), as /tokenize counts them
    add_special_tokens: bool = True

    def _neutral_values(self) -> dict[str, Any]:
        return {**super()._neutral_values(), "suffix": None}

    @property
    def engine_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token the engine computes: echo with logprobs needs
        the prompt's; vLLM's prompt_logprobs asks for them directly."""
        asked = [n for n in (self.prompt_logprobs,
                             self.logprobs if self.echo else None) if n is not None]
        return max(asked) if asked else None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt: Any) -> Any:
        return prompt_shape(prompt)  # counted and typed before the union tries its items

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError(f"got {len(prompt)} prompts: send one prompt per request")
            return prompt[0]
        return prompt


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: bool = False  # vLLM's: the chat template writes its own

    def _parts(self) -> list[WarnsUndeclared]:
        return [*super()._parts(), *self.messages]

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_count(cls, messages: Any) -> Any:
        return bounded_list(messages, MAX_MESSAGES, "messages")
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name
    logprobs: bool = False  # each output token's logprob
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # and N alternatives
    tools: list[Any] | None = None

    def _neutral_values(self) -> dict[str, Any]:
        return {**super()._neutral_values(), "tools": []}

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise ValueError(f"top_logprobs={top} needs logprobs=true (as OpenAI's API)")
        return top

    @property
    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def engine_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    @model_validator(mode="after")
    def _one_max_tokens(self) -> ChatCompletionRequest:
        """max_completion_tokens is OpenAI's newer name for max_tokens: both may be sent,
        but not with different values."""
        new, old = self.max_completion_tokens, self.max_tokens
        if new is not None and old is not None and new != old:
            raise ValueError(f"max_completion_tokens={new} differs from max_tokens={old}:"
                             " send one (max_completion_tokens is its newer name)")
        return self
