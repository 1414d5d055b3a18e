"""The two questions `batchpilot trace report` needs that the others do not answer.

- `cohort_latency`: latency of the requests that *arrived* in a window, per lane and for
  all lanes. Arrival, not finish time, decides the window, so a request counts under the
  config that was in force when it arrived; that is what comparing "before" and "after"
  a config change needs. p50/p95/p99 of TTFT, TPOT, E2E and queue delay.
- `kv_crossings`: KV snapshots taken because usage crossed a watermark (the periodic
  ones left out, so a long window does not run into the row limit).

Same shape as queries.py: a DuckDB connection in, JSON-ready dicts out; epoch seconds.
"""

from __future__ import annotations

from typing import Any

from control.trace.queries import LATENCIES, MAX_ROWS, _rows, time_window

QUANTILES = (0.5, 0.95, 0.99)


def _arrived(since: float | None, until: float | None) -> tuple[str, list[float]]:
    """Half-open [since, until): a request arriving at a change's moment counts after it."""
    clauses, params = [], []
    if since is not None:
        clauses.append("arrival_time >= ?")
        params.append(since)
    if until is not None:
        clauses.append("arrival_time < ?")
        params.append(until)
    return (" AND ".join(clauses) or "TRUE"), params


def cohort_latency(con, since: float | None = None,
                   until: float | None = None) -> dict[str, Any]:
    """Requests that arrived in [since, until): counts by outcome and, for each of TTFT,
    TPOT, E2E and queue delay, how many have it (`ttft_s_n`) and its p50/p95/p99
    (`ttft_s_p95`), rejections left out (their e2e is 0). `all` is every lane together,
    `lanes` one row per lane."""
    if since is not None and until is not None and since > until:
        raise ValueError(f"since={since} must not be after until={until}")
    where, params = _arrived(since, until)
    served = "FILTER (WHERE outcome <> 'rejected')"
    stats = ", ".join(
        f"count({c}) {served} AS {c}_n, " + ", ".join(
            f"quantile_cont({c}, {q}) {served} AS {c}_p{round(q * 100)}" for q in QUANTILES)
        for c in LATENCIES)
    rows = _rows(con, f"""
        SELECT lane, grouping(lane) AS is_all, count(*) AS requests,
               count(*) FILTER (WHERE outcome = 'finished') AS finished,
               count(*) FILTER (WHERE outcome = 'rejected') AS rejected,
               count(*) FILTER (WHERE outcome IN ('cancelled', 'timeout', 'error')) AS failed,
               {stats}
        FROM requests WHERE {where}
        GROUP BY GROUPING SETS ((lane), ()) ORDER BY is_all DESC, lane""", params)
    total = next((r for r in rows if r["is_all"]), None)
    lanes = [r for r in rows if not r["is_all"]]
    for r in rows:
        del r["is_all"]
    return {"since": since, "until": until, "all": total, "lanes": lanes}


def kv_crossings(con, since: float | None = None,
                 until: float | None = None) -> list[dict[str, Any]]:
    """KV snapshots taken because usage crossed the high or reject watermark, oldest first."""
    where, params = time_window("time", since, until)
    return _rows(con, f"""
        SELECT time, step_id, trigger, usage, used, total, high_watermark, reject_watermark
        FROM kv_snapshots WHERE {where} AND trigger <> 'periodic'
        ORDER BY time LIMIT {MAX_ROWS}""", params)
