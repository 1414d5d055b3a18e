"""A generation request's structured output (`response_format`, vLLM's `guided_json`):
checked, then compiled to a grammar on the tokenizer thread, never on the event loop or the
engine thread (engine/structured). Every refusal is a 400 naming the field the client sent.
"""

from __future__ import annotations

import dataclasses

from control.api.errors import APIError
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from control.serve.state import ServerState
from engine.request import SamplingParams


async def with_grammar(state: ServerState, body: CompletionRequest | ChatCompletionRequest,
                       params: SamplingParams) -> SamplingParams:
    """`params` with the body's structured output compiled for the served model (unchanged
    when the body asks for none)."""
    try:
        spec, field = body.structured_output
    except ValueError as exc:  # guided_json's schema, or guided_json with response_format
        raise APIError(400, str(exc), code="invalid_value", param="guided_json") from None
    if spec is None:
        return params
    executor = state.parts.engine.executor
    # NOTE: the executors that sample from a model (engine/sampler.py, which applies the
    # grammar) are those that compute logprobs; another (a simulator) would ignore it
    if not getattr(executor, "computes_logprobs", False):
        raise APIError(400, f"{field} is not supported by this engine: its executor"
                       f" ({type(executor).__name__}) runs no model, so it cannot constrain"
                       " its tokens", code="invalid_value", param=field)
    try:  # ignore_eos / min_tokens with a grammar: refused before paying for a compile
        params = dataclasses.replace(params, structured_output=spec)
    except ValueError as exc:
        name = str(exc).split("=", 1)[0]
        raise APIError(400, str(exc), code="invalid_value",
                       param=name if name.isidentifier() else field) from None
    parts = state.parts

    def compile_grammar() -> SamplingParams:  # on the tokenizer thread
        from engine.structured.grammar import bind_params, cache_for  # imports xgrammar

        return bind_params(params, lambda: cache_for(
            parts.frontend_tokenizer, parts.vocab_size, parts.engine.eos_token_id),
            field_name=field)

    try:
        return await state.run_tokenizer(compile_grammar)
    except ValueError as exc:  # the schema is refused by the compiler
        raise APIError(400, str(exc), code="invalid_value", param=field) from None
