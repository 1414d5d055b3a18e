"""Time series over the trace for charts: every query aggregates into at most `buckets`
time buckets in DuckDB, so a day of steps (a million rows) comes back as a few hundred.

Each function takes a DuckDB connection and a window (epoch seconds; None = the data's
own first/last time) and returns JSON-ready rows whose `time` is the bucket's start.
Shared by the HTTP read API (/v1/trace/series/...) and the dashboard's file mode.
"""

from __future__ import annotations

import math
from typing import Any

from control.trace.queries import GROUPS, LATENCIES, _rows, checked_limit, time_window

NICE_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600)
MAX_BUCKETS = 2000


def bucket_seconds(span_s: float, buckets: int) -> float:
    """The smallest round bucket (1 s, 2 s, 5 s ... 6 h) giving at most `buckets` buckets."""
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets={buckets} must be in 1..{MAX_BUCKETS}")
    want = max(span_s, 1.0) / buckets
    for nice in NICE_BUCKETS_S:
        if nice >= want:
            return float(nice)
    return float(math.ceil(want / 3600) * 3600)


def _span(con, table: str, column: str, since: float | None,
          until: float | None) -> tuple[float | None, float | None]:
    if since is not None and until is not None:
        return since, until
    lo, hi = con.execute(f"SELECT min({column}), max({column}) FROM {table}").fetchone()
    return (lo if since is None else since), (hi if until is None else until)


def _frame(con, table: str, column: str, since: float | None, until: float | None,
           buckets: int) -> tuple[str, list[Any], float]:
    """WHERE clause, its parameters and the bucket size for a window over `table`."""
    lo, hi = _span(con, table, column, since, until)
    bucket_s = bucket_seconds((hi - lo) if lo is not None and hi is not None else 0, buckets)
    where, params = time_window(column, since, until)
    return where, params, bucket_s


def latency_series(con, since: float | None = None, until: float | None = None,
                   buckets: int = 120, by: str = "lane") -> dict[str, Any]:
    """p50/p95/p99 of TTFT, TPOT, E2E and queue delay per bucket of finish time and group
    (rejections excluded: they have no latency)."""
    if by not in GROUPS:
        raise ValueError(f"by={by!r} must be one of {', '.join(GROUPS)}")
    where, params, bucket_s = _frame(con, "requests", "finished_time", since, until, buckets)
    pcts = ", ".join(f"quantile_cont({c}, {q}) AS {c}_p{round(q * 100)}"
                     for c in LATENCIES for q in (0.5, 0.95, 0.99))
    rows = _rows(con, f"""
        SELECT floor(finished_time / ?) * ? AS time, {by} AS "group", count(*) AS requests,
               {pcts}
        FROM requests WHERE {where} AND outcome <> 'rejected'
        GROUP BY ALL ORDER BY 1, 2""", [bucket_s, bucket_s] + params)
    return {"bucket_s": bucket_s, "by": by, "rows": rows}


def step_series(con, since: float | None = None, until: float | None = None,
                buckets: int = 300) -> dict[str, Any]:
    """Per bucket: steps, prefill and decode tokens (and per second), the token budget and
    the most tokens one step used, step duration, KV usage, preemptions, config version."""
    where, params, bucket_s = _frame(con, "steps", "start_time", since, until, buckets)
    rows = _rows(con, f"""
        SELECT floor(start_time / ?) * ? AS time, count(*) AS steps,
               sum(num_prefill_tokens) AS prefill_tokens,
               sum(num_decode_tokens) AS decode_tokens,
               sum(num_prefill_tokens) / ? AS prefill_tps,
               sum(num_decode_tokens) / ? AS decode_tps,
               max(token_budget) AS token_budget, max(tokens_used) AS tokens_used_max,
               avg(tokens_used) AS tokens_used_mean, max(max_num_seqs) AS max_num_seqs,
               avg(duration_s) AS step_s_mean, max(duration_s) AS step_s_max,
               avg(kv_usage) AS kv_usage_mean, max(kv_usage) AS kv_usage_max,
               sum(len(preempted)) AS preemptions, max(config_version) AS config_version
        FROM steps WHERE {where} GROUP BY 1 ORDER BY 1""",
                 [bucket_s, bucket_s, bucket_s, bucket_s] + params)
    return {"bucket_s": bucket_s, "rows": rows}


def queue_series(con, since: float | None = None, until: float | None = None,
                 buckets: int = 300) -> dict[str, Any]:
    """Mean running and waiting requests per lane per bucket, and waiting by reason."""
    where, params, bucket_s = _frame(con, "steps", "start_time", since, until, buckets)
    series = {}
    for name, column in (("running", "running_by_lane"), ("waiting", "waiting_by_lane"),
                         ("waiting_by_reason", "waiting_by_reason")):
        series[name] = _rows(con, f"""
            WITH counts AS (
                SELECT floor(start_time / ?) * ? AS time, count(*) AS steps
                FROM steps WHERE {where} GROUP BY 1),
            e AS (
                SELECT floor(start_time / ?) * ? AS time,
                       unnest(map_keys({column})) AS key, unnest(map_values({column})) AS n
                FROM steps WHERE {where})
            SELECT time, key, sum(n) / any_value(counts.steps) AS mean
            FROM e JOIN counts USING (time) GROUP BY time, key ORDER BY time, key""",
                             [bucket_s, bucket_s] + params + [bucket_s, bucket_s] + params)
    return {"bucket_s": bucket_s, **series}


def outcome_series(con, since: float | None = None, until: float | None = None,
                   buckets: int = 120) -> dict[str, Any]:
    """Requests that did not finish normally (rejected, timeout, cancelled, error) per
    bucket, outcome and reason, by their finish; and as outcome `deferred`, those admitted
    behind the requests on time (reason slo_deferred), by their admission."""
    where, params, bucket_s = _frame(con, "requests", "finished_time", since, until, buckets)
    awhere, aparams = time_window("time", since, until)
    rows = _rows(con, f"""
        SELECT floor(finished_time / ?) * ? AS time, outcome,
               coalesce(nullif(finish_detail, ''), finish_reason, outcome) AS reason,
               count(*) AS requests
        FROM requests WHERE {where} AND outcome <> 'finished' GROUP BY ALL
        UNION ALL
        SELECT floor(time / ?) * ? AS time, 'deferred' AS outcome, reason, count(*)
        FROM admissions WHERE {awhere} AND kind = 'admitted' AND reason <> '' GROUP BY ALL
        ORDER BY 1, 2, 3""", [bucket_s, bucket_s] + params + [bucket_s, bucket_s] + aparams)
    return {"bucket_s": bucket_s, "rows": rows}


def config_changes(con, since: float | None = None,
                   until: float | None = None) -> list[dict[str, Any]]:
    """Every config change in the window: time, version, source, actor, diff (JSON), note."""
    where, params = time_window("time", since, until)
    return _rows(con, f"SELECT time, version, source, actor, change, note FROM config_changes"
                 f" WHERE {where} ORDER BY time, version", params)


def loadtest_runs(con, limit: int = 100) -> list[dict[str, Any]]:
    """The latest load-test results (one row per run and config), newest first; [] when
    no load test was stored here."""
    limit = checked_limit(limit, 1000)
    found = con.execute("SELECT count(*) FROM information_schema.tables"
                        " WHERE table_name = 'loadtest_runs'").fetchone()[0]
    if not found:
        return []
    return _rows(con, "SELECT * FROM loadtest_runs ORDER BY started DESC, label"
                 f" LIMIT {limit}", [])
