"""n > 1: one engine request per choice, sharing the prompt's KV blocks.

    choice 0   id            computes the prompt ........ decodes
    choice i   id-i (i > 0)  waits (`sibling_prefill`) -> starts from choice 0's prefix-cache
                             blocks (the prompt's full blocks), decodes

Choice i samples with `seed + i` when a seed is given (each its own generator). Every choice
passes admission; when a later one is refused, those admitted end (`choice_rejected`) and
the refusal answers the request. The choices share the client: one disconnect, timeout or
close aborts every unfinished one. Usage counts the prompt once and every choice's
completion tokens. Prompt logprobs (echo, prompt_logprobs) are computed by the first choice
only and shown for every one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from fastapi import Request

from control.api.arrival import seconds_since_arrival
from control.api.generation import Generation, SharedReceive
from control.otel.context import child_link
from control.serve.engine_loop import AsyncEngine
from control.serve.state import ServerState
from control.serve.streams import RequestStream, Submission
from engine.records import AdmissionDecision

SEED_MODULUS = 2**63  # seeds stay in the API's range


async def admit_choices(engine: AsyncEngine, sub: Submission, n: int,
                        ) -> tuple[AdmissionDecision, list[RequestStream]]:
    """Admit `n` choices of `sub`: (the first decision, or the refusal; their streams, none
    when refused)."""
    decision, stream = await engine.add(sub)
    if stream is None:
        return decision, []
    streams = [stream]
    try:
        for i in range(1, n):
            seed = sub.params.seed
            # the prompt's logprobs come from the first choice: a later one asking for them
            # would compute its whole prompt (engine/logprobs.py) instead of sharing it
            params = replace(sub.params, prompt_logprobs=None,
                             seed=None if seed is None else (seed + i) % SEED_MODULUS)
            refused, sibling = await engine.add(replace(
                sub, request_id=f"{sub.request_id}-{i}", params=params,
                wait_for=sub.request_id,
                trace=None if sub.trace is None else child_link(sub.trace)))
            if sibling is None:
                _abort(engine, streams, "choice_rejected")
                return refused, []
            streams.append(sibling)
    except asyncio.CancelledError:  # the caller left: none of them may run
        _abort(engine, streams, "client_disconnect")
        raise
    return decision, streams


def _abort(engine: AsyncEngine, streams: list[RequestStream], reason: str) -> None:
    for stream in streams:
        engine.abort(stream.request_id, reason)


def choice_generations(state: ServerState, request: Request, streams: list[RequestStream], *,
                       timeout_s: float, streaming: bool,
                       ) -> tuple[list[Generation], Callable[[], None]]:
    """A Generation per choice, watching one client; and what to call once the response
    is done (after closing them)."""
    shared = SharedReceive(request.receive) if len(streams) > 1 else None
    waited_s = seconds_since_arrival(request)
    gens = [Generation(state.engine, stream, shared or request.receive, timeout_s=timeout_s,
                       streaming=streaming, waited_s=waited_s, probe=state.delivery)
            for stream in streams]

    def done() -> None:
        if shared is not None:
            shared.close()
        state.finished_one()

    return gens, done
