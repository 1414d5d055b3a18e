"""Bodies parsed by hand, where FastAPI's own parsing cannot choose the shape (vLLM's
/tokenize takes a prompt or messages): the same 400s FastAPI gives, naming the field.
Used by the server's routes and by the edge process (control/edge/) alike.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from control.api.field_policy import ignored_header, ignored_names, merge_ignored

log = logging.getLogger("batchpilot.http")


async def json_body(request: Request) -> Any:
    """The request's body as JSON; not JSON (or not UTF-8): the 400 FastAPI would give."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested ~1,000 deep
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": "JSON decode error",
                                       "ctx": {"error": str(exc)}}]) from None


def parse_body(model: type[BaseModel], raw: Any, *, warn_unknown: bool = True) -> Any:
    """`raw` validated as `model`: a 400 naming the field, as every route answers; fields
    outside the shape are ignored with a warning naming them, as vLLM does."""
    return parse_body_naming_ignored(model, raw, warn_unknown=warn_unknown)[0]


def parse_body_naming_ignored(model: type[BaseModel], raw: Any, *,
                              warn_unknown: bool = True) -> tuple[Any, list[str]]:
    """parse_body, and the fields it ignored as an answer names them (field_policy.py:
    each with the declared field closest to it; messages' keys by their path)."""
    try:
        body = model.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    unknown = sorted(set(raw) - set(model.model_fields))
    nested = [getattr(m, "_ignored", []) for m in getattr(body, "messages", ())]
    names = merge_ignored(ignored_names(unknown, list(model.model_fields)), *nested)
    if names and warn_unknown:
        log.warning("%s: ignored fields outside vLLM's request shape: %s", model.__name__,
                    ", ".join(names))
    return body, names


def name_ignored(response: Response, names: list[str]) -> None:
    """The X-Batchpilot-Ignored-Fields header of an answer that ignored `names`."""
    if names:
        response.headers["X-Batchpilot-Ignored-Fields"] = ignored_header(names)
