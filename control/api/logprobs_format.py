"""Logprobs in OpenAI's and vLLM's response shapes (the engine's `Logprob`s, decoded).

    chat         choices[].logprobs = {"content": [{token, logprob, bytes,
                                                    top_logprobs: [{token, logprob, bytes}]}],
                                       "refusal": null}
    completions  choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}
                 (legacy; with echo the prompt's tokens come first, the first with nulls)
    vLLM's       prompt_logprobs = [null, {"<token id>": {logprob, rank, decoded_token}}]
                 (completions: on the choice; chat: on the response)

Values are the raw model distribution's (engine/logprobs.py), floored at -9999 (JSON has
no -inf; vLLM's floor). A completions top_logprobs dict holds the N likeliest and the
chosen token (so N or N + 1 entries, as vLLM); a chat top_logprobs list holds exactly N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.output.processor import Logprob

MIN_LOGPROB = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[Logprob], top_n: int) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs` for these output tokens."""
    return {"content": [{**_token(e.token, e.logprob),
                         "top_logprobs": [_token(t, lp) for _, t, lp in e.top[:top_n]]}
                        for e in entries], "refusal": None}


@dataclass
class CompletionLogprobs:
    """One completions choice's legacy logprobs, rendered piece by piece (a stream's
    chunks): `offset` is the next token's character offset in the choice's text."""

    top_n: int
    offset: int = 0

    def render(self, entries: Sequence[Logprob], first_token: str | None = None,
               ) -> dict[str, Any]:
        """`first_token`: the echoed prompt's first token, which has no logprob."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        if first_token is not None:
            tokens.append(first_token)
            values.append(None)
            tops.append(None)
            offsets.append(self.offset)
            self.offset += len(first_token)
        for e in entries:
            tokens.append(e.token)
            values.append(_value(e.logprob))
            top = {t: _value(lp) for _, t, lp in e.top[:self.top_n]}
            top.setdefault(e.token, _value(e.logprob))
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(e.token)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}


def vllm_prompt_logprobs(entries: Sequence[Logprob], top_n: int,
                         ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then per token its own
    entry and the `top_n` likeliest, keyed by token id."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for e in entries:
        row = {str(t): {"logprob": _value(lp), "rank": rank, "decoded_token": text}
               for rank, (t, text, lp) in enumerate(e.top[:top_n], start=1)}
        row[str(e.token_id)] = {"logprob": _value(e.logprob), "rank": e.rank,
                                "decoded_token": e.token}
        out.append(row)
    return out
