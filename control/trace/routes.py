"""The trace read API: fixed questions over the server's DuckDB trace (no SQL from callers).

    GET /v1/trace/summary?since=&until=
    GET /v1/trace/steps?since=&until=&limit=&batch=     steps in a window
    GET /v1/trace/steps/around?at=&before=&after=       the steps around a moment
    GET /v1/trace/requests/{request_id}                 one request's timeline
    GET /v1/trace/slow?since=&until=&limit=&by=         slowest requests, where time went
    GET /v1/trace/latency?since=&until=&by=lane|tenant  latency breakdown by group
    GET /v1/trace/kv?since=&until=&bucket_s=            KV usage over time
    GET /v1/trace/series/{latency|steps|queues|outcomes}?since=&until=&buckets=[&by=]
                                                        charts: at most `buckets` time buckets
    GET /v1/trace/config_changes?since=&until=          every config change, with its diff
    GET /v1/loadtest/runs?limit=                        stored load-test results, newest first
    GET /v1/trace/checklist                             facts for the go-live checklist
    GET /v1/loadtest/stats?long_prompt_tokens=&limit=   load-test length spread per run
    GET /v1/trace/report/latency?since=&until=          latency of the requests that arrived
    GET /v1/trace/report/kv_crossings?since=&until=     KV watermark crossings

Times: epoch seconds, ISO 8601, 14:02, or relative (-15m). Each read first waits (up to
2 s) for the writer to commit what the engine has handed it, so a read sees the latest
steps. Handlers are plain functions: FastAPI runs them on its thread pool, off the event
loop, each with its own DuckDB cursor.

Who may read: every route here but /metrics needs a read token whenever the server has
tokens (401 without, checked before any parameter: `trace_reader`), whatever flags turned
other routes off; POST /v1/loadtest/results an admin one. Without tokens the server listens
on loopback only (control/admin/auth.py). A token bound to tenants reads through
control/trace/tenant_scope.py: its tenants' requests, steps and KV as aggregates, another
tenant's request id a 404 like a missing one; config_changes, checklist and the load-test
routes answer it 403 (they show the server's config or every tenant's). /metrics stays open:
Prometheus scrapes it, and its tenant labels are bounded by --metrics-tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import duckdb
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from control.admin.auth import Caller, caller, require_unbound
from control.api.errors import APIError, shown, value_error
from control.api.query_check import check_known_query
from control.serve.state import get_state
from control.trace import facts, queries, report_queries, series
from control.trace.tenant_scope import UNBOUND_ONLY, scope
from control.trace.timeparse import parse_time

router = APIRouter()
SYNC_TIMEOUT_S = 2.0


@router.get("/metrics")
def metrics(request: Request) -> Response:
    state = get_state(request)
    if state.metrics is None:
        raise APIError(404, "metrics are off for this server", code="metrics_off")
    if state.observer is not None:  # apply the steps already taken (normally none left)
        state.observer.sync(SYNC_TIMEOUT_S)
    body, content_type = state.metrics.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)


def trace_reader(request: Request) -> Caller:
    """Who reads the trace: a read token whenever the server has tokens (401/403 here, as a
    dependency, before any parameter is validated or any table looked at); then a query
    parameter the route does not take is a 400 (control/api/query_check.py)."""
    who = caller(request, get_state(request).control_tokens, "read")
    check_known_query(request)
    return who


def trace_admin(request: Request) -> Caller:
    """Who writes to the trace (load-test results): an admin token whenever the server has
    tokens, with or without --no-control-api (401/403 before the body is validated)."""
    who = caller(request, get_state(request).control_tokens, "admin")
    check_known_query(request)
    return who


Reader = Annotated[Caller, Depends(trace_reader)]
Admin = Annotated[Caller, Depends(trace_admin)]


def _read(request: Request, who: Caller, fn: Callable[..., Any], *args: Any,
          **kwargs: Any) -> Any:
    """`fn(cursor, ...)` on a cursor of this read, scoped to `who`'s tenants if bound."""
    writer = get_state(request).trace
    if writer is None:
        raise APIError(404, "tracing is off: start the server with --trace-db PATH",
                       code="trace_off")
    writer.sync(SYNC_TIMEOUT_S)
    con = writer.cursor()
    try:
        if who.bound:  # TEMP views on this cursor only; closing it drops them
            scope(con, who.tenants or ())
        return fn(con, *args, **kwargs)
    except ValueError as exc:
        raise value_error(exc) from None
    finally:
        con.close()


def query_time(value: str | None, name: str) -> float | None:
    """A `since`/`until` query value as epoch seconds; 400 naming it when unreadable."""
    try:
        return parse_time(value)
    except ValueError as exc:
        raise APIError(400, f"{name}: {exc}", code="invalid_value", param=name) from None


def query_window(since: str | None, until: str | None) -> tuple[float | None, float | None]:
    """`since` and `until` as epoch seconds; a 400 naming the one unreadable (an empty
    window is the queries' ValueError: queries.checked_window)."""
    return query_time(since, "since"), query_time(until, "until")


@router.get("/v1/trace/summary")
def summary(request: Request, who: Reader, since: str | None = None,
            until: str | None = None) -> Any:
    return _read(request, who, queries.summary, *query_window(since, until))


@router.get("/v1/trace/steps")
def steps(request: Request, who: Reader, since: str | None = None, until: str | None = None,
          limit: int = 1000, batch: bool = False) -> Any:
    return _read(request, who, queries.steps, *query_window(since, until), limit,
                 batch)


@router.get("/v1/trace/steps/around")
def steps_around(request: Request, who: Reader, at: str, before: int = 5,
                 after: int = 5) -> Any:
    return _read(request, who, queries.steps_around, query_time(at, "at"), before, after)


@router.get("/v1/trace/requests/{request_id}")
def request_timeline(request: Request, who: Reader, request_id: str) -> Any:
    # NOTE: for a tenant-bound token another tenant's request is not in its scope, so it
    # gets this same 404: the answer tells it nothing about which ids exist
    timeline = _read(request, who, queries.request_timeline, request_id)
    if timeline is None:
        raise APIError(404, f"request {shown(request_id)} is not in the trace (it may still be"
                       " queued, or retention removed it)", code="not_found")
    return timeline


@router.get("/v1/trace/slow")
def slow(request: Request, who: Reader, since: str | None = None, until: str | None = None,
         limit: int = 10, by: str = "e2e_s") -> Any:
    return _read(request, who, queries.slow, *query_window(since, until), limit,
                 by)


@router.get("/v1/trace/latency")
def latency(request: Request, who: Reader, since: str | None = None,
            until: str | None = None, by: str = "lane") -> Any:
    return _read(request, who, queries.latency, *query_window(since, until), by)


@router.get("/v1/trace/kv")
def kv(request: Request, who: Reader, since: str | None = None, until: str | None = None,
       bucket_s: float = 10.0) -> Any:
    return _read(request, who, queries.kv_usage, *query_window(since, until),
                 bucket_s)


SERIES = {"latency": series.latency_series, "steps": series.step_series,
          "queues": series.queue_series, "outcomes": series.outcome_series}


@router.get("/v1/trace/series/{kind}")
def time_series(request: Request, who: Reader, kind: str, since: str | None = None,
                until: str | None = None, buckets: int = 300, by: str | None = None) -> Any:
    if kind not in SERIES:
        raise APIError(404, f"no series {shown(kind)}: one of {', '.join(SERIES)}",
                       code="not_found")
    if by is not None and kind != "latency":
        raise APIError(400, "by= applies to the latency series only", code="invalid_value",
                       param="by")
    extra = {"by": by} if by is not None else {}
    return _read(request, who, SERIES[kind], *query_window(since, until),
                 buckets, **extra)


@router.get("/v1/trace/config_changes")
def config_changes(request: Request, who: Reader, since: str | None = None,
                   until: str | None = None) -> Any:
    require_unbound(who, UNBOUND_ONLY["config_changes"])
    return _read(request, who, series.config_changes, *query_window(since, until))


@router.get("/v1/loadtest/runs")
def loadtest_runs(request: Request, who: Reader, limit: int = 100) -> Any:
    require_unbound(who, UNBOUND_ONLY["loadtest_runs"])
    return _read(request, who, series.loadtest_runs, limit)


@router.get("/v1/trace/checklist")
def checklist_facts(request: Request, who: Reader) -> Any:
    require_unbound(who, UNBOUND_ONLY["checklist_facts"])
    return _read(request, who, facts.checklist_facts)


@router.get("/v1/loadtest/stats")
def loadtest_stats(request: Request, who: Reader, long_prompt_tokens: int = 512,
                   limit: int = 100) -> Any:
    require_unbound(who, UNBOUND_ONLY["loadtest_stats"])
    return _read(request, who, facts.loadtest_stats, long_prompt_tokens, limit)


@router.get("/v1/trace/report/latency")
def cohort_latency(request: Request, who: Reader, since: str | None = None,
                   until: str | None = None) -> Any:
    return _read(request, who, report_queries.cohort_latency, *query_window(since, until))


@router.get("/v1/trace/report/kv_crossings")
def kv_crossings(request: Request, who: Reader, since: str | None = None,
                 until: str | None = None) -> Any:
    return _read(request, who, report_queries.kv_crossings, *query_window(since, until))


@router.post("/v1/loadtest/results")
def loadtest_results(request: Request, who: Admin, body: dict[str, Any]) -> dict[str, Any]:
    """Store `batchpilot loadtest` results in the trace DB (tables loadtest_runs and
    loadtest_requests), so the dashboard and the checklist find them. Admin scope whenever
    the server has tokens, with or without --no-control-api."""
    from control.loadtest.results_body import ResultsBodyError, checked_runs
    from control.loadtest.store import TABLE_COLUMNS, insert_runs

    state = get_state(request)
    if state.trace is None:
        raise APIError(404, "tracing is off: start the server with --trace-db PATH, or save"
                       " the results with `batchpilot loadtest --db FILE`", code="trace_off")
    try:
        runs = checked_runs(body)
    except ResultsBodyError as exc:
        raise APIError(400, str(exc), code="invalid_value", param="runs") from None
    con = state.trace.cursor()
    try:
        insert_runs(con, runs)
    except (TypeError, ValueError, duckdb.Error) as exc:  # a value of the wrong type
        raise APIError(400, f"malformed results: {exc}", code="invalid_value",
                       param="runs") from None
    finally:
        con.close()
    return {"stored_runs": len(runs),
            "stored_rows": {table: sum(len(run.get(table, ())) for run in runs)
                            for table in TABLE_COLUMNS}}
