"""A generation request checked against the server's RequestLimits (control/api/limits.py)
before the work each limit bounds: the prompt's size before it is tokenized, the sampling
fields before they reach the engine. Each refusal is a 400 that names the field and the
limit (`--limit NAME=VALUE` raises it).

Why a prompt's characters bound its tokens: every token decodes to at most the longest
vocabulary entry's characters (byte-level BPE and SentencePiece entries are spelled with
one character per byte or per character), so a text longer than max_model_len x that
cannot fit the context, whatever it tokenizes to; it is refused without tokenizing it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from control.api.errors import APIError
from control.api.limits import RequestLimits

_LONGEST_TOKEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the longest vocabulary entry (added tokens included); once per
    tokenizer (~10 ms for a 49k vocabulary)."""
    try:
        return _LONGEST_TOKEN[tokenizer]
    except (KeyError, TypeError):
        pass
    longest = max((len(entry) for entry in tokenizer.get_vocab()), default=1)
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _LONGEST_TOKEN[tokenizer] = longest
    return longest


def prompt_char_limit(limits: RequestLimits, tokenizer: Any, max_model_len: int) -> int:
    if limits.max_prompt_chars is not None:
        return limits.max_prompt_chars
    return max_model_len * longest_token_chars(tokenizer)


def check_prompt_chars(chars: int, limits: RequestLimits, tokenizer: Any,
                       max_model_len: int, field: str) -> None:
    """400 naming `field` when a prompt of `chars` characters is over the limit."""
    limit = prompt_char_limit(limits, tokenizer, max_model_len)
    if chars > limit:
        source = ("limit max_prompt_chars" if limits.max_prompt_chars is not None else
                  f"max_model_len={max_model_len} tokens x the longest token's"
                  f" {limit // max_model_len} characters; limit max_prompt_chars sets it")
        raise APIError(400, f"{field} has {chars} characters, more than {limit} ({source}):"
                       " it cannot fit the model's context", code="context_length_exceeded",
                       param=field)


def check_prompt_ids(count: int, max_model_len: int) -> None:
    """A prompt of token ids longer than the context: refused before checking each id."""
    if count > max_model_len:
        raise APIError(400, f"prompt has {count} token ids, more than max_model_len="
                       f"{max_model_len}", code="context_length_exceeded", param="prompt")


def check_sampling_limits(body: Any, limits: RequestLimits, max_tokens: int) -> None:
    """logit_bias entries, stop strings' length, and n x max_tokens of one request (n > 1)."""
    bias = body.logit_bias or {}
    if len(bias) > limits.max_logit_bias:
        raise APIError(400, f"logit_bias has {len(bias)} entries, more than"
                       f" {limits.max_logit_bias} (limit max_logit_bias)",
                       code="invalid_value", param="logit_bias")
    for stop in body.stop_list:
        if len(stop) > limits.max_stop_chars:
            raise APIError(400, f"a stop string has {len(stop)} characters, more than"
                           f" {limits.max_stop_chars} (limit max_stop_chars)",
                           code="invalid_value", param="stop")
    # NOTE: one choice's max_tokens is bounded by the context, by admission (too_long, a
    # rejection the trace records); this bounds what n choices multiply it to
    total = body.n * max_tokens
    if body.n > 1 and total > limits.max_generated_tokens:
        raise APIError(400, f"n={body.n} x max_tokens={max_tokens} = {total} tokens is more"
                       f" than {limits.max_generated_tokens} (limit max_generated_tokens):"
                       " ask for fewer choices or fewer tokens", code="invalid_value",
                       param="max_tokens")


def check_messages(count: int, limits: RequestLimits) -> None:
    """Chat messages over the limit: refused before the chat template renders them (pure
    Python on the tokenizer thread, holding the GIL the engine thread needs)."""
    if count > limits.max_messages:
        raise APIError(400, f"messages has {count} entries, more than {limits.max_messages}"
                       " (limit max_messages)", code="invalid_value", param="messages")
