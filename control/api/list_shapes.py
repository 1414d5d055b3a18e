"""Shape checks for a request's list and object fields, run before pydantic validates their
items (`mode="before"`).

Why: a field typed as a union of lists (`prompt: str | list[str] | list[int] |
list[list[int]]`, `stop: str | list[str]`) that matches no member is tried against each,
and each failing list reports one error per item: a 400,000-id prompt with one string in it
took 1.6 s of the event loop to refuse (800,000 errors), holding every other request. So a
list is measured first and its item types checked in one pass, and a bad one is refused
with one error; pydantic then sees only lists that fit one member.
"""

from __future__ import annotations

from typing import Any

MAX_PROMPT_IDS = 1 << 17  # token ids in one prompt: past any context this server runs
MAX_MESSAGES = 1 << 14  # chat messages, hard cap (the limit max_messages is lower)
MAX_LOGIT_BIAS = 1 << 14  # logit_bias entries, hard cap (the limit max_logit_bias is lower)
MAX_STOP_STRINGS = 16  # stop strings in one request


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_ids_shape(values: Any) -> Any:
    """A list of at most MAX_PROMPT_IDS token ids (ints, not bools), checked in one pass."""
    if isinstance(values, list):
        _ids(values)
    return values


def _ids(values: list[Any]) -> None:
    if len(values) > MAX_PROMPT_IDS:
        raise ValueError(f"has {len(values)} token ids; at most {MAX_PROMPT_IDS}")
    if not all(_is_id(v) for v in values):
        raise ValueError("a list of token ids must hold integers only")


def prompt_shape(prompt: Any) -> Any:
    """A completions prompt: a string, token ids, or one of those in a list."""
    if not isinstance(prompt, list) or not prompt:
        return prompt
    if all(isinstance(p, str) for p in prompt[:1]):
        if len(prompt) != 1:
            raise ValueError(f"got {len(prompt)} prompts: send one prompt per request")
        if not isinstance(prompt[0], str):
            raise ValueError("must be a string, a list of token ids, or one of those in a list")
        return prompt
    if isinstance(prompt[0], list):
        if len(prompt) != 1:
            raise ValueError(f"got {len(prompt)} prompts: send one prompt per request")
        _ids(prompt[0])
        return prompt
    _ids(prompt)
    return prompt


def bounded_list(value: Any, limit: int, what: str) -> Any:
    """A list of at most `limit` entries, counted before its items are validated."""
    if isinstance(value, list) and len(value) > limit:
        raise ValueError(f"at most {limit} {what}, got {len(value)}")
    return value


def stop_shape(stop: Any) -> Any:
    """`stop`: a string, or a list of strings of at most MAX_STOP_STRINGS."""
    bounded_list(stop, MAX_STOP_STRINGS, "stop strings")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise ValueError("must be a string or a list of strings")
    return stop


def bounded_object(value: Any, limit: int, what: str) -> Any:
    if isinstance(value, dict) and len(value) > limit:
        raise ValueError(f"at most {limit} {what}, got {len(value)}")
    return value
