"""GET /v1/trace/export/{table}?since=&until=: one trace table's rows as Parquet.

What a fleet ingress pulls from each replica to answer an aggregate question (summary,
latency, series, ...) over the whole fleet (control/fleet/trace_fanout.py): a replica owns
its DuckDB file, so the rows come over its HTTP API. The window keeps every row a
question about [since, until] reads (a superset: requests by arrival OR finish time),
so a long window costs a long transfer. `request_ids` (request numbers -> ids) the
ingress pulls only to answer a tenant-bound caller's row questions itself.

A read token whenever the server has tokens (401 without). A token bound to tenants gets
its scope of each table (control/trace/tenant_scope.py: the tenants' requests, steps with
other tenants' ids NULL, ...), and 403 for config_changes and the load-test tables.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from control.admin.auth import require_unbound
from control.api.errors import APIError, shown, value_error
from control.serve.state import get_state
from control.trace.queries import checked_window, time_window
from control.trace.routes import Reader, query_window
from control.trace.tenant_scope import UNBOUND_TABLES, scope

router = APIRouter()
PARQUET = "application/vnd.apache.parquet"
SYNC_TIMEOUT_S = 2.0
# table -> its time column, or None (exported whole); requests: see _window
WINDOWS: dict[str, str | None] = {
    "steps": "start_time", "requests": None, "admissions": "time", "kv_snapshots": "time",
    "config_changes": "time", "runs": None, "loadtest_runs": None,
    "loadtest_requests": None, "request_ids": None,
}


def _window(table: str, since: float | None, until: float | None) -> tuple[str, list[Any]]:
    checked_window(since, until)
    clauses, params = [], []
    if table == "requests":  # arrived by `until` and not finished before `since`
        if until is not None:
            clauses.append("arrival_time <= ?")
            params.append(until)
        if since is not None:
            clauses.append("(finished_time IS NULL OR finished_time >= ?)")
            params.append(since)
    elif table == "request_ids" and until is not None:  # numbered by `until`: a step of
        clauses.append("time <= ?")  # the window may run a request numbered before it
        params.append(until)
    elif WINDOWS[table] is not None:
        return time_window(WINDOWS[table], since, until)
    return " AND ".join(clauses) or "TRUE", params


@router.get("/v1/trace/export/{table}")
def export_table(request: Request, who: Reader, table: str, since: str | None = None,
                 until: str | None = None) -> Response:
    if table not in WINDOWS:
        raise APIError(404, f"table={shown(table)} must be one of {', '.join(WINDOWS)}",
                       code="not_found", param="table")
    if table in UNBOUND_TABLES:
        require_unbound(who, UNBOUND_TABLES[table])
    writer = get_state(request).trace
    if writer is None:
        raise APIError(404, "tracing is off: start the server with --trace-db PATH",
                       code="trace_off")
    try:
        where, params = _window(table, *query_window(since, until))
    except ValueError as exc:
        raise value_error(exc) from None
    writer.sync(SYNC_TIMEOUT_S)
    con = writer.cursor()
    try:
        exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE"
                             " table_name = ?", [table]).fetchone()[0]
        if not exists:  # the load-test tables appear with the first stored load test
            raise APIError(404, f"no table {shown(table)} in this trace", code="not_found")
        if who.bound:  # TEMP views shadow the tables on this cursor only
            scope(con, who.tenants or ())
        with tempfile.TemporaryDirectory(prefix="bp-export-") as tmp:
            path = os.path.join(tmp, f"{table}.parquet")
            # NOTE: table is one of WINDOWS' names and the path ours: no caller text in SQL
            con.execute(f"COPY (SELECT * FROM {table} WHERE {where}) TO '{path}'"
                        " (FORMAT parquet)", params)
            with open(path, "rb") as f:
                data = f.read()
    finally:
        con.close()
    return Response(data, media_type=PARQUET)
