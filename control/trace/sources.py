"""Where trace answers come from: a trace file opened read-only in this process, or a
running server's read API. Both answer the same named questions with the same JSON, so
`batchpilot trace`, the dashboard and the checklist work the same over either.

    source = FileSource("trace.duckdb")   # or UrlSource("http://127.0.0.1:8000")
    source.ask("slow", limit=5)
    source.ask("series_steps", since=t0, buckets=300)
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from control.cli.http_json import HTTPFailure, request_json
from control.trace import facts, queries, report_queries, series

HTTP_TIMEOUT_S = 30.0
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
    """A failure to report on stderr, with the exit code it gets."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


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


class UrlSource:
    """A running server's trace read API."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def ask(self, question: str, **params: Any) -> Any:
        route = QUESTIONS[question][1]
        if "request_id" in params:
            route = route.format(request_id=urllib.parse.quote(params.pop("request_id"),
                                                               safe=""))
        query = urllib.parse.urlencode({k: str(v).lower() if isinstance(v, bool) else v
                                        for k, v in params.items() if v is not None})
        try:
            return request_json(self.url, route + (f"?{query}" if query else ""),
                                timeout_s=HTTP_TIMEOUT_S)
        except HTTPFailure as exc:
            if exc.status is None:
                raise TraceError(exc.message, 1) from None
            raise TraceError(f"the server answered {exc.status}: {exc.message}",
                             2 if exc.status == 400 else 1) from None
