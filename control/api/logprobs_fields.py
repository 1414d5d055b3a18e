"""The route's part of logprobs: refuse them where the engine computes none, and set up a
response's logprobs and completions' echo.

Only the model runner computes logprobs (`computes_logprobs`); an engine over another
executor (a simulator, a test fake) answers a request that asks for them with a 400
naming the field rather than a reply without them. `echo` alone needs no model: it
returns the prompt's text.
"""

from __future__ import annotations

from typing import Any

from control.api.errors import APIError
from control.api.openai_format import Echo, ResponseFormat
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from control.serve.state import ServerState


async def with_logprobs(state: ServerState, body: CompletionRequest | ChatCompletionRequest,
                        fmt: ResponseFormat, text: str | None, ids: list[int]) -> None:
    """Set `fmt`'s logprob fields from `body`; a 400 naming the field when the engine
    cannot compute them. Echo's text is decoded on the tokenizer thread."""
    asked = [(name, value) for name, value in (("logprobs", body.engine_logprobs),
                                               ("prompt_logprobs", body.prompt_logprobs))
             if value is not None]
    if asked and not getattr(state.parts.engine.executor, "computes_logprobs", False):
        name, value = asked[0]
        shown = getattr(body, name)
        raise APIError(400, f"{name}={shown!r} is not supported by this engine: its executor"
                       f" ({type(state.parts.engine.executor).__name__}) runs no model, so"
                       " it has no logprobs", code="invalid_value", param=name)
    fmt.top_logprobs = body.engine_logprobs
    fmt.prompt_logprobs = body.prompt_logprobs
    if isinstance(body, CompletionRequest) and body.echo:
        echo_text, first = await state.run_tokenizer(_echo, state, text, ids)
        fmt.echo = Echo(echo_text, first)


def _echo(state: ServerState, text: str | None, ids: list[int]) -> tuple[str, str]:
    """On the tokenizer thread: (the prompt's text, its first token's text). A prompt sent
    as token ids is decoded as it is, special tokens kept."""
    tokenizer: Any = state.parts.frontend_tokenizer
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=False)
    first = tokenizer.decode(ids[:1], skip_special_tokens=False)
    return text, first
