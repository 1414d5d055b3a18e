"""Where trace answers come from: a trace file opened read-only in this process, or a
running server's read API. Both answer the same named questions with the same JSON, so
`batchpilot trace`, the dashboard and the checklist work the same over either.

    source = FileSource("trace.duckdb")   # or UrlSource("http://127.0.0.1:8000")
    source.ask("slow", limit=5)
    source.ask("series_steps", since=t0, buckets=300)

A fleet reads as one: `open_source("DIR/*.duckdb")` (FleetFileSource: each replica's file)
or a fleet ingress's URL (it fans trace reads out to every replica); rows then carry
`replica`, and `replica="1"` reads one replica only (the ingress: X-Batchpilot-Replica).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from control.cli.http_json import HTTPFailure, request_json
from control.trace import facts, queries, report_queries, series

HTTP_TIMEOUT_S = 30.0
REPLICA_HEADER = "X-Batchpilot-Replica"  # a fleet ingress: ask this replica only
# question -> (the query over a connection, the server's route for it)
QUESTIONS: dict[str, tuple[Callable[..., Any], str]] = {
    "summary": (queries.summary, "/v1/trace/summary"),
    "slow": (queries.slow, "/v1/trace/slow"),
    "steps": (queries.steps, "/v1/trace/steps"),
    "steps_around": (queries.steps_around, "/v1/trace/steps/around"),
    "request": (queries.request_timeline, "/v1/trace/requests/{request_id}"),
    "latency": (queries.latency, "/v1/trace/latency"),
    "kv": (queries.kv_usage, "/v1/trace/kv"),
    "series_latency": (series.latency_series, "/v1/trace/series/latency"),
    "series_steps": (series.step_series, "/v1/trace/series/steps"),
    "series_queues": (series.queue_series, "/v1/trace/series/queues"),
    "series_outcomes": (series.outcome_series, "/v1/trace/series/outcomes"),
    "config_changes": (series.config_changes, "/v1/trace/config_changes"),
    "loadtest_runs": (series.loadtest_runs, "/v1/loadtest/runs"),
    "checklist_facts": (facts.checklist_facts, "/v1/trace/checklist"),
    "loadtest_stats": (facts.loadtest_stats, "/v1/loadtest/stats"),
    "cohort_latency": (report_queries.cohort_latency, "/v1/trace/report/latency"),
    "kv_crossings": (report_queries.kv_crossings, "/v1/trace/report/kv_crossings"),
}


class TraceError(Exception):
    """A failure to report on stderr, with the exit code it gets (and the server's HTTP
    status, when a server answered)."""

    def __init__(self, message: str, code: int, status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


def not_found(request_id: str) -> TraceError:
    return TraceError(f"request {request_id!r} is not in the trace (it may still be queued,"
                      " or retention removed it)", 1)


class FileSource:
    """A trace file, opened read-only for each question (a server must not hold it)."""

    def __init__(self, path: str):
        self.path = path

    def connect(self) -> Any:
        from control.trace.store import open_read_only  # imports duckdb

        try:
            return open_read_only(self.path)
        except ValueError as exc:
            raise TraceError(str(exc), 2) from None

    def ask(self, question: str, **params: Any) -> Any:
        con = self.connect()
        try:
            data = QUESTIONS[question][0](con, **params)
        except ValueError as exc:
            raise TraceError(str(exc), 2) from None
        finally:
            con.close()
        if data is None:
            raise not_found(params["request_id"])
        return json.loads(json.dumps(data, default=str))  # what the HTTP API would send


class FleetFileSource(FileSource):
    """Trace files of a fleet's replicas (a glob), read as one: row questions ask each file
    and merge (fleet_merge.py), aggregates run over the union of their tables (fleet_db.py).
    Every file is opened read-only: the replicas must have stopped (or read copies)."""

    def __init__(self, pattern: str, replica: str | None = None):
        super().__init__(pattern)
        self.replica = replica

    def paths(self) -> dict[str, str]:
        from control.trace.fleet_db import expand

        try:
            return expand(self.path, self.replica)
        except ValueError as exc:
            raise TraceError(str(exc), 2) from None

    def connect(self) -> Any:
        from control.trace.fleet_db import open_files

        try:
            return open_files(self.paths())
        except ValueError as exc:
            raise TraceError(str(exc), 2) from None

    def ask(self, question: str, **params: Any) -> Any:
        from control.trace import fleet_merge

        if question in fleet_merge.ROW_QUESTIONS:
            answers = [(replica, _ask_file(FileSource(path), question, params))
                       for replica, path in self.paths().items()]
            data = fleet_merge.merge(question, params, answers)
        else:
            con = self.connect()
            try:
                data = fleet_merge.label_runs(con, _run(con, question, params))
            finally:
                con.close()
        if data is None:
            raise not_found(params["request_id"])
        return json.loads(json.dumps(data, default=str))


def _run(con: Any, question: str, params: dict[str, Any]) -> Any:
    try:
        return QUESTIONS[question][0](con, **params)
    except ValueError as exc:
        raise TraceError(str(exc), 2) from None


def _ask_file(source: FileSource, question: str, params: dict[str, Any]) -> Any:
    con = source.connect()
    try:
        return _run(con, question, params)
    finally:
        con.close()


def open_source(db: str | None = None, url: str | None = None,
                replica: str | None = None, token: str | None = None,
                ) -> FileSource | UrlSource:
    """--db FILE (a glob: a fleet's files) or --url URL (with `token`, the bearer token a
    server with tokens needs for every trace read); `replica` picks one replica."""
    from control.trace.fleet_db import is_pattern

    if db is not None:
        if is_pattern(db) or replica is not None:
            return FleetFileSource(db, replica)
        return FileSource(db)
    if url is None:
        raise TraceError("give a trace file (--db) or a server's URL (--url)", 2)
    return UrlSource(url, replica, token)


class UrlSource:
    """A running server's trace read API (a fleet ingress's: every replica's, merged;
    `replica` asks one, by the X-Batchpilot-Replica header). `token`: sent as
    `Authorization: Bearer` with every question (a token bound to tenants reads their
    requests only: the server scopes its answers)."""

    def __init__(self, url: str, replica: str | None = None, token: str | None = None):
        self.url = url.rstrip("/")
        self.replica = replica
        self.token = token or None
        self._checked = replica is None

    def _check_fleet(self) -> None:
        """A replica can be named only at a fleet ingress (one server ignores the header):
        its /readyz lists the replicas."""
        try:
            ready = request_json(self.url, "/readyz", timeout_s=HTTP_TIMEOUT_S)
        except HTTPFailure as exc:
            ready = exc.body if exc.status == 503 else None
            if exc.status is None:
                raise TraceError(exc.message, 1) from None
        ids = [str(r.get("replica_id")) for r in (ready or {}).get("replicas") or ()]
        if not ids:
            raise TraceError(f"replica={self.replica!r}: {self.url} is not a fleet ingress"
                             " (`batchpilot fleet`); one server has no replicas", 2)
        if self.replica not in ids:
            raise TraceError(f"replica={self.replica!r} must be one of {', '.join(ids)}", 2)
        self._checked = True

    def ask(self, question: str, **params: Any) -> Any:
        if not self._checked:
            self._check_fleet()
        route = QUESTIONS[question][1]
        if "request_id" in params:
            route = route.format(request_id=urllib.parse.quote(params.pop("request_id"),
                                                               safe=""))
        query = urllib.parse.urlencode({k: str(v).lower() if isinstance(v, bool) else v
                                        for k, v in params.items() if v is not None})
        headers = {REPLICA_HEADER: self.replica} if self.replica is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            return request_json(self.url, route + (f"?{query}" if query else ""),
                                headers=headers, timeout_s=HTTP_TIMEOUT_S)
        except HTTPFailure as exc:
            if exc.status is None:
                raise TraceError(exc.message, 1) from None
            hint = " (no token was sent: set $BATCHPILOT_TOKEN or --token-env NAME)" \
                if exc.status == 401 and not self.token else ""
            raise TraceError(f"the server answered {exc.status}: {exc.message}{hint}",
                             2 if exc.status == 400 else 1, exc.status) from None
