"""Query parameters a route does not take, refused on batchpilot's own APIs: the trace and
load-test reads, what-if and /control. There a typo (`?sinse=-15m`, `?limt=5`) was ignored
and the answer silently covered all time or the default count. A 400 names the unknown
parameters and the ones the route takes. Called by those routes' auth dependencies, after
the token check (a caller without one gets its 401 first, as before).

The OpenAI-compatible routes do not call this: they ignore unknown query parameters as vLLM
and OpenAI do (Azure-style clients send `api-version` on every call).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from control.api.errors import APIError


def check_known_query(request: Request) -> None:
    """APIError 400 when the request has a query parameter its route does not declare."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    taken = _query_names(dependant)  # (a few fields: walked again, not cached by route)
    unknown = sorted(set(request.query_params) - taken)
    if unknown:
        takes = ", ".join(sorted(taken)) or "no query parameters"
        raise APIError(400, f"unknown query parameter{'s' if len(unknown) > 1 else ''}"
                       f" {', '.join(unknown)}: {request.url.path} takes {takes}",
                       code="invalid_value", param=unknown[0])


def _query_names(dependant: Any) -> set[str]:
    """The query parameters of a FastAPI Dependant and its sub-dependencies."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
