"""The fleet's trace read API on the ingress: every `/v1/trace/*` question of one server
(control/trace/routes.py), answered over all replicas as one trace.

    row questions (slow, steps, a request, config changes, ...)  each replica answers;
        the rows are merged as one trace would order them, each labelled `replica`
        (control/trace/fleet_merge.py)
    aggregates (summary, latency, kv, series, checklist facts, ...)  each replica's rows in
        the window come over as Parquet (GET /v1/trace/export/{table}), and the same query
        runs here over their union (control/trace/fleet_db.py): the fleet's own percentiles
    X-Batchpilot-Replica: ID                                     that replica only, as is

A replica that does not answer fails the read (502 naming it) rather than leaving its
rows out: ask the others one by one with X-Batchpilot-Replica.

Who may read: the ingress checks the caller's token against the fleet's tokens
(FleetIngress.control_tokens) on every route here, as one server does (a read token
whenever the fleet has tokens; 401 without), and passes the caller's Authorization on to
each replica (one started with the same tokens checks it again). A token bound to tenants
is never answered with a replica's rows as they come (a replica may run without tokens, and
then would not scope them): each replica's tables come over as Parquet, and the question
runs here on their union scoped to the caller's tenants (control/trace/tenant_scope.py,
the same rules as one server), for row questions too (their rows then carry no `replica`);
the questions one server answers a bound token 403, this answers 403. `guard_forwarded` is
the same check for what the ingress relays as is (its catch-all route).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import TypeAdapter, ValidationError

from control.admin.auth import Caller, caller, require_unbound
from control.api.errors import APIError, shown, value_error
from control.trace import fleet_merge
from control.trace.export_route import WINDOWS
from control.trace.sources import QUESTIONS
from control.trace.tenant_scope import UNBOUND_ONLY, UNBOUND_TABLES
from control.trace.timeparse import parse_time

REPLICA_HEADER = "x-batchpilot-replica"
TIMES = ("since", "until", "at")
Headers = list[tuple[bytes, bytes]]
# what an unbound caller's aggregates read (request_ids: only the row questions use it)
AGGREGATE_TABLES = [t for t in WINDOWS if t != "request_ids"]
# what a bound caller's questions read: every table it may see (its scope), none it may not
SCOPED_TABLES = [t for t in WINDOWS if t not in UNBOUND_TABLES]


def install_trace_routes(app: FastAPI, fleet: Any) -> None:
    """Mount one GET route per trace question (before the ingress's catch-all route)."""
    for question, (fn, route) in QUESTIONS.items():
        app.add_api_route(route, _handler(fleet, question, fn), methods=["GET"],
                          name=f"fleet_trace_{question}", include_in_schema=False)


def _handler(fleet: Any, question: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(request: Request) -> Response:
        who = caller(request, fleet.control_tokens, "read")  # before anything else
        if question in UNBOUND_ONLY:
            require_unbound(who, UNBOUND_ONLY[question])
        auth = _authorization(request)
        if who.bound:  # never a replica's rows as they come: see the module docstring
            named = request.headers.get(REPLICA_HEADER) is not None
            replicas = [fleet.named_replica(request)] if named else \
                fleet.live_ids()
            return await _aggregate(fleet, fn, typed_params(fn, request), auth, replicas,
                                    who)
        if request.headers.get(REPLICA_HEADER) is not None:
            return await fleet.forward(request, b"", fleet.named_replica(request),
                                       retry=False)
        params = typed_params(fn, request)
        if question in fleet_merge.ROW_QUESTIONS:
            return await _rows(fleet, question, params, request, auth)
        return await _aggregate(fleet, fn, params, auth, fleet.live_ids())

    return handler


def _authorization(request: Request) -> Headers:
    """The caller's Authorization, for the replicas (one with tokens checks it too)."""
    value = request.headers.get("authorization")
    return [(b"authorization", value.encode("latin-1"))] if value is not None else []


def guard_forwarded(request: Request, tokens: tuple[Any, ...]) -> None:
    """The ingress's catch-all relays a request to one replica as is; for the routes that
    need a token on one server the fleet's tokens are checked first, at the ingress:
    POST /v1/loadtest/results an admin token, /v1/whatif and any /v1/trace or /v1/loadtest
    path a read token not bound to tenants (a replica's answer relayed as is is not scoped
    to them, and a replica may run without tokens)."""
    # NOTE: normalised as a router might read it (case, repeated and trailing slashes), so
    # no spelling of a guarded path slips past this check to a replica that matches it
    path = re.sub(r"/+", "/", request.url.path).rstrip("/").lower()
    if path == "/v1/loadtest/results":
        caller(request, tokens, "admin")
    elif path.startswith(("/v1/whatif", "/v1/trace", "/v1/loadtest")):
        require_unbound(caller(request, tokens, "read"), f"{request.url.path} (relayed to one"
                        " replica as is, not scoped to its tenants)")


_FLAG = TypeAdapter(bool)  # reads a flag as FastAPI does for one server's query


def typed_params(fn: Callable[..., Any], request: Request) -> dict[str, Any]:
    """The query (and path) parameters as the question's function takes them: times parsed
    as the server parses them, numbers and flags by the function's defaults."""
    signature = inspect.signature(fn).parameters
    given = {**request.query_params, **request.path_params}
    params: dict[str, Any] = {}
    for name, text in given.items():
        if name not in signature or name == "con":
            raise APIError(400, f"{name}= is not a parameter of {request.url.path}",
                           code="invalid_value", param=name)
        default = signature[name].default
        try:
            if name in TIMES:
                params[name] = parse_time(text)
            elif isinstance(default, bool):  # as FastAPI reads a flag for one server
                params[name] = _flag(text)
            elif isinstance(default, int):
                params[name] = int(text)
            elif isinstance(default, float):
                params[name] = float(text)
            else:
                params[name] = text
        except ValueError as exc:
            raise APIError(400, f"{name}={shown(text)}: {exc}", code="invalid_value",
                           param=name) from None
    missing = [name for name, p in signature.items() if name != "con"
               and p.default is inspect.Parameter.empty and name not in params]
    if missing:  # the function would raise TypeError: a 500
        raise APIError(400, f"{request.url.path} needs {missing[0]}=", code="invalid_value",
                       param=missing[0])
    return params


async def call(fleet: Any, replica_id: int, path: str, query: bytes = b"",
               headers: Headers | None = None) -> tuple[int, bytes]:
    """One GET to one replica -> (status, body); (0, why) when it did not answer."""
    status, chunks = 0, []
    try:
        async for message in fleet.handles[replica_id].options(stream=True).http.remote(
                "GET", path, query, headers or [], b""):
            status = message.get("status", status)
            chunks.append(message.get("body", b""))
    except Exception as exc:  # down or restarting
        return 0, repr(exc).encode()
    return status, b"".join(chunks)


def _error(body: bytes) -> dict[str, Any]:
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return {"message": body.decode(errors="replace")[:200], "code": None}


def _check(answers: list[tuple[int, int, bytes]], path: str, found_ok: bool = False) -> None:
    """Raise what a failed read should answer: the replicas' 400 or 404 (trace off) as they
    said it, a replica that did not answer as 502."""
    down = [(i, status, body) for i, status, body in answers
            if status == 0 or status >= 500]
    if down:
        names = ", ".join(f"replica {i} ({status or 'no answer'}:"
                          f" {_error(body).get('message')})" for i, status, body in down)
        raise APIError(502, f"{path}: {names} did not answer; the fleet's trace would miss"
                       " their rows; ask each replica with X-Batchpilot-Replica",
                       code="replica_failed", headers={"Retry-After": "1"})
    for i, status, body in answers:
        error = _error(body) if status != 200 else None
        if error is None or (found_ok and status == 404 and error.get("code") == "not_found"):
            continue
        if error.get("code") == "trace_off":
            raise APIError(404, f"tracing is off on replica {i}: start the fleet with"
                           " --trace-dir DIR (each replica writes DIR/replica-<id>.duckdb)",
                           code="trace_off")
        raise APIError(status, f"replica {i}: {error.get('message')}",
                       code=error.get("code") or "replica_error")


async def _rows(fleet: Any, question: str, params: dict[str, Any],
                request: Request, auth: Headers) -> Response:
    query = request.scope.get("query_string", b"")
    path = request.url.path
    answers = await asyncio.gather(*(_tagged(fleet, i, path, query, auth)
                                     for i in fleet.live_ids()))
    _check(answers, path, found_ok=question == "request")
    replies = [(str(i), json.loads(body) if status == 200 else None)
               for i, status, body in answers]
    merged = fleet_merge.merge(question, params, replies)
    if merged is None:
        raise APIError(404, f"request {shown(params.get('request_id'))} is not in any replica's"
                       " trace (it may still be queued, or retention removed it)",
                       code="not_found")
    return JSONResponse(merged)


async def _tagged(fleet: Any, i: int, path: str, query: bytes,
                  auth: Headers) -> tuple[int, int, bytes]:
    return (i, *await call(fleet, i, path, query, auth))


async def _aggregate(fleet: Any, fn: Callable[..., Any], params: dict[str, Any],
                     auth: Headers, replicas: list[int], who: Caller | None = None,
                     ) -> Response:
    """`fn` over the union of `replicas`' tables in the window; scoped to `who`'s tenants
    when it is bound (then every question comes here, row questions too)."""
    window = {k: params[k] for k in ("since", "until") if params.get(k) is not None}
    query = urllib.parse.urlencode(window).encode()
    bound = who is not None and who.bound
    tables = SCOPED_TABLES if bound else AGGREGATE_TABLES
    jobs = [(i, t) for i in replicas for t in tables]
    answers = await asyncio.gather(*(call(fleet, i, f"/v1/trace/export/{t}", query, auth)
                                     for i, t in jobs))
    # a table a replica does not have yet (the load-test tables) is left out, not an error
    tagged = [(i, status, body) for (i, t), (status, body) in zip(jobs, answers, strict=True)
              if not (status == 404 and _error(body).get("code") == "not_found")]
    _check(tagged, "/v1/trace/export")
    parts: dict[str, dict[str, bytes]] = {str(i): {} for i in replicas}
    for (i, table), (status, body) in zip(jobs, answers, strict=True):
        if status == 200:
            parts[str(i)][table] = body
    tenants = who.tenants if bound and who is not None else None
    data = await asyncio.to_thread(_run_over, parts, fn, params, tenants)
    if data is None:  # a request's timeline: not in (their scope of) any replica's trace
        raise APIError(404, f"request {shown(params.get('request_id'))} is not in any replica's"
                       " trace (it may still be queued, or retention removed it)",
                       code="not_found")
    return JSONResponse(data)


def _run_over(parts: dict[str, dict[str, bytes]], fn: Callable[..., Any],
              params: dict[str, Any], tenants: tuple[str, ...] | None = None) -> Any:
    from control.trace.fleet_db import open_parquet
    from control.trace.schema import TABLES
    from control.trace.tenant_scope import scope

    con = open_parquet(parts)
    try:
        if tenants is not None:
            have = {r[0] for r in con.execute("SELECT table_name FROM"
                                              " information_schema.tables").fetchall()}
            for name in TABLES.keys() - have:  # not pulled (config_changes): empty
                con.execute(TABLES[name].ddl())
            scope(con, tenants)
        data = fleet_merge.label_runs(con, fn(con, **params))
    except ValueError as exc:
        raise value_error(exc) from None
    finally:
        con.close()
    return json.loads(json.dumps(data, default=str))


def _flag(text: str) -> bool:
    try:
        return _FLAG.validate_python(text)
    except ValidationError:
        raise ValueError("must be true or false") from None
