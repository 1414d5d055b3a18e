"""The server's bounds on what one request may ask for: each checked at the edge, before the
work it bounds (a body before it is parsed, a prompt before it is tokenized whole, a schema
before it is compiled), each refused with a 413/400/429 that names the setting.

    batchpilot serve --limit max_body_bytes=1048576 --limit grammar_compile_timeout_s=5

Every limit is one field below, with its default; docs/security.md lists them with why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config.known_keys import did_you_mean

MIB = 1024 * 1024


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = 4 * MIB  # one request body, any route (413 before parsing)
    # A prompt's characters (completions' text, or all chat messages' text). None: derived
    # from the model, max_model_len x the longest token's characters, past which the prompt
    # cannot fit whatever it tokenizes to (control/api/request_limits.py)
    max_prompt_chars: int | None = None
    max_messages: int = 2048  # chat messages of one request (rendering them holds the GIL)
    max_logit_bias: int = 300  # logit_bias entries (OpenAI's and vLLM's cap)
    max_generated_tokens: int = 65_536  # n x max_tokens of one request with n > 1
    max_stop_chars: int = 256  # characters of each stop string (at most 16 strings)
    max_schema_bytes: int = 64 * 1024  # a response_format / guided_json schema, as JSON
    grammar_compile_timeout_s: float = 10.0  # past it: a 400, and the tokenizer thread free
    max_grammar_compiles: int = 2  # compiles running at once; more waiting: 429
    max_whatif_proposals: int = 8  # proposals in one POST /v1/whatif
    max_whatif_window_s: float = 7 * 24 * 3600.0  # since..until of one what-if
    max_whatif_waiting: int = 4  # what-if predictions queued or running; more: 429

    def validate(self) -> RequestLimits:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"limit {f.name}={value!r} must be a number > 0")
        return self

    def with_values(self, assignments: dict[str, str]) -> RequestLimits:
        """These limits with `{"name": "value"}` (from --limit name=value) applied; a
        ValueError names an unknown limit or a value that is not a number."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for name, text in assignments.items():
            if name not in fields:
                raise ValueError(f"unknown limit {name!r}{did_you_mean([name], fields)};"
                                 f" limits: {', '.join(fields)}")
            as_float = name.endswith("_s")
            try:
                changes[name] = float(text) if as_float else int(text)
            except ValueError:
                kind = "a number" if as_float else "a whole number"
                raise ValueError(f"limit {name}={text!r} must be {kind}") from None
        return dataclasses.replace(self, **changes).validate()


def parse_limit_args(values: list[str] | None) -> dict[str, str]:
    """['max_body_bytes=1048576', ...] -> {'max_body_bytes': '1048576'}."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise ValueError(f"--limit {value!r} must be NAME=VALUE")
        out[name.strip()] = text.strip()
    return out
