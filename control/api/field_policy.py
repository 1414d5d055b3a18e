"""What a generation request's undeclared fields get: an OpenAI or vLLM field this server
does not implement is refused with a 400 naming it (unless sent at its "off" value); any
other is ignored, as vLLM does (clients send fields of other servers' dialects), but never
silently: the log names it, and so does the answer (the X-Batchpilot-Ignored-Fields header
and `batchpilot.ignored_fields`), with the declared field it was probably meant to be
(`max_token (did you mean max_tokens?)`). Objects nested in a request (stream_options)
follow the same rule, their keys named by their path."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from control.api.header_values import header_text
from engine.config.known_keys import did_you_mean

log = logging.getLogger("batchpilot.http")
MAX_NAMED = 8  # ignored fields named in an answer; more are counted ("and 3 more")
MAX_NAME_CHARS = 64  # of each name as the answer repeats it
MORE = ""  # ignored_names' placeholder for a name past MAX_NAMED
MAX_IGNORED_HEADER = 512  # characters of X-Batchpilot-Ignored-Fields (the body has them all)

# OpenAI and vLLM request fields this server does not implement (and does not declare),
# with the values that mean "off": those are accepted, any other is refused with a 400.
UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, True, False), "audio": (None,), "prediction": (None,),
    "modalities": (None, ["text"]), "web_search_options": (None,),
    "reasoning_effort": (None,), "use_beam_search": (None, False),
    "length_penalty": (None, 1.0), "allowed_token_ids": (None,), "bad_words": (None, []),
    "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True), "truncate_prompt_tokens": (None,),
    "return_tokens_as_token_ids": (None, False), "logits_processors": (None, []),
    "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "structural_tag": (None,), "structured_outputs": (None,),
    "chat_template": (None,), "chat_template_kwargs": (None, {}), "documents": (None,),
    "mm_processor_kwargs": (None, {}), "continue_final_message": (None, False),
    "add_generation_prompt": (None, True),
    "echo": (None, False),  # vLLM's chat field (completions declares its own)
    # OpenAI's: `store` keeps the answer for OpenAI's own dashboards (nothing here keeps
    # it); `verbosity` asks a reasoning model for shorter or longer answers
    "store": (None, False), "verbosity": (None,),
}
# OpenAI's fields with no effect on a self-hosted server (metadata, service_tier,
# prompt_cache_key, safety_identifier: labels and hints for OpenAI's own service) are not
# declared either: they are ignored and named like a field of another dialect.


def check_undeclared(declared: Collection[str], data: Any, prefix: str = "") -> list[str]:
    """Raise ValueError naming the first UNIMPLEMENTED field of `data` (a request body, or
    an object nested in one) sent at a value other than "off"; the other undeclared
    fields, as the answer names them (ignored_names). `prefix`: where `data` sits in the
    body ("stream_options."), put before each key, so a nested key is looked up and named
    by its full path."""
    if not isinstance(data, dict):
        return []
    undeclared = {f"{prefix}{k}": v for k, v in data.items() if k not in declared}
    for name, value in undeclared.items():
        if name in UNIMPLEMENTED and value not in UNIMPLEMENTED[name]:
            raise ValueError(f"{name}={value!r} is not supported by this server")
    ignored = sorted(k for k in undeclared if k not in UNIMPLEMENTED)
    if not ignored:
        return []
    return ignored_names(ignored, [f"{prefix}{k}" for k in declared])


def log_ignored(model: str, names: list[str]) -> None:
    """One warning a request, for the fields it and its nested objects had ignored."""
    if names:
        log.warning("%s: ignored fields this server does not read: %s",
                    model, ", ".join(names))


def ignored_names(ignored: list[str], declared: list[str]) -> list[str]:
    """Each ignored field as an answer names it: cut to MAX_NAME_CHARS, with the declared
    field closest to it; at most MAX_NAMED of them (merge_ignored counts the rest)."""
    cut = [name[:MAX_NAME_CHARS] for name in ignored[:MAX_NAMED]]
    return [f"{name}{did_you_mean([name], declared)}" for name in cut] + \
        [MORE] * (len(ignored) - len(cut))


def merge_ignored(*lists: list[str]) -> list[str]:
    """One list for a request and its nested objects (each object's from ignored_names):
    each name once, at most MAX_NAMED, then "and N more" for the rest."""
    names, more = [], 0
    for name in (n for names_of in lists for n in names_of):
        if name == MORE or (name not in names and len(names) == MAX_NAMED):
            more += 1
        elif name not in names:
            names.append(name)
    return names + ([f"and {more} more"] if more else [])


def ignored_header(names: list[str] | tuple[str, ...]) -> str:
    """X-Batchpilot-Ignored-Fields' value: the names percent-encoded where not printable
    ASCII, cut to MAX_IGNORED_HEADER (a proxy may refuse a reply whose headers pass 4 KB)."""
    text = header_text(", ".join(names))
    return text if len(text) <= MAX_IGNORED_HEADER else text[:MAX_IGNORED_HEADER - 4] + " ..."
