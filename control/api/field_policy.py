"""What a generation request's undeclared fields get: an OpenAI or vLLM field this server
does not implement is refused with a 400 naming it (unless sent at its "off" value); any
other is ignored with a warning naming it in the log, as vLLM does. Objects nested in a
request (stream_options) follow the same rule, their keys named by their path."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

log = logging.getLogger("batchpilot.http")

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
    "add_generation_prompt": (None, True), "add_special_tokens": (None, False),
    "echo": (None, False),  # vLLM's chat field (completions declares its own)
}


def check_undeclared(model: str, declared: Collection[str], data: Any,
                     prefix: str = "") -> None:
    """Raise ValueError naming the first UNIMPLEMENTED field of `data` (a request body, or
    an object nested in one) sent at a value other than "off"; log the names of the other
    undeclared fields. `prefix`: where `data` sits in the body ("stream_options."), put
    before each key, so a nested key is looked up and named by its full path."""
    if not isinstance(data, dict):
        return
    undeclared = {f"{prefix}{k}": v for k, v in data.items() if k not in declared}
    for name, value in undeclared.items():
        if name in UNIMPLEMENTED and value not in UNIMPLEMENTED[name]:
            raise ValueError(f"{name}={value!r} is not supported by this server")
    ignored = sorted(k for k in undeclared if k not in UNIMPLEMENTED)
    if ignored:
        log.warning("%s: ignored fields outside the OpenAI and vLLM request shapes: %s",
                    model, ", ".join(ignored))
