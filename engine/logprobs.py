"""Log-probabilities: what the executor returns beside its sampled tokens.

Logprobs are of the raw model distribution: log_softmax of the model's logits, before any
logits processor (penalties, logit_bias, min_tokens) and before temperature, top-k, top-p
and min_p (vLLM's default, `raw_logprobs`). So a token's logprob says what the model
thinks of it, whatever the request's sampling settings; a greedy token is the row's top
entry unless a processor moved the argmax.

Computed in batch (engine/execution/sampler.py `score_rows`), only for the rows that ask: a step
where none asks does no extra work. This module stays free of torch (the engine core and
the simulator import it).

An executor without a model (engine/sim) returns a plain list of token ids: its requests
get no logprobs (`Request.logprobs` stays short of the outputs, and the output processor
reports None); the HTTP API, which serves only the model runner, refuses such requests
with a 400 when its executor has no `computes_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20  # the most alternatives a row may ask for (OpenAI's top_logprobs bound)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability at one position, its rank (1: the most likely; prompt
    tokens only, None for sampled ones: OpenAI's shapes carry none, and it costs a [L, V]
    comparison), and the position's `top` alternatives: (token id, logprob), most likely
    first."""

    token_id: int
    logprob: float
    rank: int | None
    top: tuple[tuple[int, float], ...] = ()


class SampledTokens(list):
    """An executor's result: one sampled token id per sample row (it is a `list[int]`, so
    an executor without a model returns a plain list), plus what the rows asked for.

    logprobs: None when no row asked, else one entry per sample row (None for rows that
    did not ask). prompt_logprobs: request id -> the entries of the prompt positions its
    prefill chunk computed in this step (position i's entry is token i + 1's logprob).
    """

    logprobs: list[TokenLogprob | None] | None
    prompt_logprobs: dict[str, list[TokenLogprob]]

    def __init__(self, token_ids: list[int],
                 logprobs: list[TokenLogprob | None] | None = None,
                 prompt_logprobs: dict[str, list[TokenLogprob]] | None = None):
        super().__init__(token_ids)
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs or {}

