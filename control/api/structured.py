"""A generation request's structured output (`response_format`, vLLM's `guided_json`):
checked, then compiled to a grammar off the event loop and off the tokenizer thread
(engine/structured). Every refusal names the field the client sent.

Bounds (control/api/limits.py), because one schema can cost minutes of compile:

    max_schema_bytes           the compact schema's UTF-8 bytes; more: 400, before compiling
    grammar_compile_timeout_s  the compile awaited this long; past it: 400. The compile
                               cannot be interrupted: it runs on, holding its slot only
    max_grammar_compiles       compiles running at once (runaways included); a new schema
                               finding them all taken: 429 + Retry-After, never a queue
    MAX_PATTERN_REPEAT         a `pattern`'s repeat count ({n}, {n,m}); more: 400, before
                               compiling. xgrammar's cost grows with the square of one
                               count (3,000: 0.4 s; 30,000: ~50 s of a core, past the
                               timeout, its slot held all along); nested repeats multiply
                               cheaply, so one count is what is bounded

The model's compiler is built once on the tokenizer thread (it reads the whole vocabulary);
each compile then runs on a compile slot (engine/structured/compile_slots.py), touching no
tokenizer, so the tokenizer thread, and with it every other request, never waits on one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from control.api.errors import APIError, retry_after, shown
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from control.serve.state import ServerState
from engine.request import SamplingParams
from engine.structured.compile_slots import CompilesBusy
from engine.structured.spec import StructuredOutput

if TYPE_CHECKING:
    from engine.structured.grammar import GrammarCache

log = logging.getLogger("batchpilot.http")
MAX_PATTERN_REPEAT = 1000
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")  # {n} {n,} {n,m}, not an escaped brace


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
    check_schema_size(spec, field, state.settings.limits.max_schema_bytes)
    check_schema_patterns(spec, field)
    executor = state.parts.engine.executor
    # NOTE: the executors that sample from a model (engine/execution/sampler.py, which applies the
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
    cache = await state.run_tokenizer(_model_cache, state, field)
    compiled = await compile_bounded(state, cache, spec, field)
    return dataclasses.replace(params, structured_output=dataclasses.replace(
        spec, compiled=compiled))


def check_schema_size(spec: StructuredOutput, field: str, max_schema_bytes: int) -> None:
    """400 when the schema, as the compact JSON the compiler reads (spec.schema: a
    guided_json string is parsed and re-serialized, so its spacing does not count), has
    more than `max_schema_bytes` UTF-8 bytes."""
    size = len(spec.schema.encode())
    if size > max_schema_bytes:
        raise APIError(400, f"{field}: the schema is {size} bytes as compact JSON; at most"
                       f" {max_schema_bytes} are accepted"
                       f" (limit max_schema_bytes={max_schema_bytes})",
                       code="invalid_value", param=field)


def check_schema_patterns(spec: StructuredOutput, field: str) -> None:
    """400 naming the pattern when one repeats a piece more than MAX_PATTERN_REPEAT times."""
    try:
        schema = json.loads(spec.schema)
    except RecursionError:  # nested ~1,000 deep: no compiler would take it either
        raise APIError(400, f"{field}: the schema nests too deep", code="invalid_value",
                       param=field) from None
    for pattern in _patterns(schema):
        counts = [int(n) for match in _REPEAT.finditer(pattern) for n in match.groups() if n]
        if counts and max(counts) > MAX_PATTERN_REPEAT:
            raise APIError(400, f"{field}: the pattern {shown(pattern)} repeats a piece"
                           f" {max(counts)} times; at most {MAX_PATTERN_REPEAT} (a repeat"
                           " count costs the grammar compile its square)",
                           code="invalid_value", param=field)


def _patterns(schema: Any) -> list[str]:
    """Every regular expression in a schema: `pattern` values, `patternProperties` keys."""
    found, stack = [], [schema]
    while stack:  # not recursive: a schema may nest deep
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    found.append(value)
                elif key == "patternProperties" and isinstance(value, dict):
                    found.extend(k for k in value if isinstance(k, str))
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _model_cache(state: ServerState, field: str) -> GrammarCache:
    """The served model's GrammarCache, its compiler built (on the tokenizer thread: the
    build reads the tokenizer's vocabulary; ~0.2 s once per model)."""
    from engine.structured.grammar import cache_for  # imports xgrammar

    parts = state.parts
    try:
        cache = cache_for(parts.frontend_tokenizer, parts.vocab_size, parts.engine.eos_token_id)
    except ValueError as exc:  # a model without EOS inside its logits: no grammar can end
        raise APIError(400, str(exc), code="invalid_value", param=field) from None
    cache.ensure_compiler()
    return cache


async def compile_bounded(state: ServerState, cache: GrammarCache, spec: StructuredOutput,
                          field: str) -> Any:
    """`spec`'s grammar.CompiledFormat, compiled on a compile slot and awaited at most
    `grammar_compile_timeout_s`: 429 when no slot is free, 400 past the timeout or when
    xgrammar refuses the schema."""
    limits, slots = state.settings.limits, state.grammar_compiles
    timeout_s = limits.grammar_compile_timeout_s
    try:  # the key holds the field: the compile's error message names it
        future = slots.submit((cache, field, spec.schema), lambda: cache.compile(spec, field))
    except CompilesBusy:
        raise APIError(429, f"{field}: the grammar compiler is busy: {slots.capacity}"
                       f" schemas are compiling (limit max_grammar_compiles={slots.capacity});"
                       " retry later",
                       code="grammar_compiler_busy", param=field,
                       headers=retry_after(timeout_s)) from None
    try:
        # shield: a timeout here must not cancel the future others may have joined
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
    except TimeoutError:
        slots.abandon(future)
        log.warning("%s: a schema of %d bytes did not compile within %g s (limit"
                    " grammar_compile_timeout_s): refused; its compile runs on (%d of %d"
                    " compile slots busy; %d timeouts since start)", field,
                    len(spec.schema.encode()), timeout_s, slots.running, slots.capacity,
                    slots.counts.timed_out)
        raise APIError(400, f"{field}: the schema did not compile within {timeout_s:g} s"
                       " (limit grammar_compile_timeout_s); simplify it (fewer nested"
                       " repeats, patterns, enums)", code="invalid_value", param=field) from None
    except ValueError as exc:  # the schema is refused by the compiler
        raise APIError(400, str(exc), code="invalid_value", param=field) from None
