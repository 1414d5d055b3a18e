"""Postmortem questions as fixed, parameterised queries. No caller-supplied SQL.

Each function takes a DuckDB connection (the server's read cursor, or a file opened
read-only by `batchpilot trace`) and returns JSON-ready dicts and lists, so the HTTP read
API and the CLI give the same answers. Times are epoch seconds; `since`/`until` None
means unbounded.
"""

from __future__ import annotations

import re
from typing import Any

from control.trace.format import clock

MAX_ROWS = 5000
TRACE_ID = re.compile(r"[0-9a-f]{32}")  # a W3C trace id (control/otel/context.py)
TRACE_REQUESTS = 20  # requests of one trace a lookup names

STEP_COLUMNS = (
    "run_id, step_id, start_time, end_time, duration_s, schedule_s, execute_s, update_s, "
    "num_prefill_seqs, num_decode_seqs, num_prefill_tokens, num_decode_tokens, token_budget,"
    " tokens_used, max_num_seqs, kv_blocks_used, kv_blocks_free, kv_blocks_cached, kv_usage,"
    " running_by_lane, waiting_by_lane, waiting_by_reason, waiting_reason_by_lane,"
    " tokens_by_lane, admitted, preempted, finished, finish_reasons, config_version,"
    " target_step_s, step_reason")
BATCH_COLUMNS = "decode_seqs, prefill_seqs, prefill_tokens"
LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s")
GROUPS = ("lane", "tenant", "outcome", "model")
SLOW_BY = ("e2e_s", "ttft_s", "queue_delay_s", "tpot_s")


def _rows(con, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def checked_window(since: float | None, until: float | None) -> None:
    """A ValueError naming both when `since` is after `until`: the window is empty, so every
    answer would be too (a 400 at the routes, exit 2 in the CLI, as for a bad limit)."""
    if since is not None and until is not None and since > until:
        raise ValueError(f"since={clock(since, date=True)} is after until="
                         f"{clock(until, date=True)}: the window is empty")


def time_window(column: str, since: float | None, until: float | None) -> tuple[str, list]:
    """A WHERE clause (and its parameters) keeping `column` within [since, until]."""
    checked_window(since, until)
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} <= ?")
        params.append(until)
    return (" AND ".join(clauses) or "TRUE"), params


MIN_BUCKET_S, MAX_BUCKET_S = 0.001, 7 * 86400.0  # kv_usage's bucket width, seconds


def checked_limit(limit: int, most: int = MAX_ROWS) -> int:
    """`limit`, when in 1..most; else a ValueError naming it (a 400 at the routes)."""
    if not 1 <= limit <= most:
        raise ValueError(f"limit={limit} must be in 1..{most}")
    return limit


def steps(con, since: float | None = None, until: float | None = None, limit: int = 1000,
          batch: bool = False) -> list[dict[str, Any]]:
    """Steps in a window, oldest first; `batch` adds which requests ran (id lists)."""
    where, params = time_window("start_time", since, until)
    cols = STEP_COLUMNS + (", " + BATCH_COLUMNS if batch else "")
    found = _rows(con, f"SELECT {cols} FROM steps WHERE {where} ORDER BY start_time"
                  f" LIMIT {checked_limit(limit)}", params)
    return _with_request_ids(con, found) if batch else found


def _with_request_ids(con, steps_: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each step's request numbers by request ids: decode_ids, prefill_ids."""
    wanted: dict[str, set[int]] = {}
    for s in steps_:  # NULL: another tenant's request, for a tenant-bound read
        wanted.setdefault(s["run_id"], set()).update(
            q for q in (*(s["decode_seqs"] or ()), *(s["prefill_seqs"] or ())) if q is not None)
    names: dict[tuple[str, int], str | None] = {}
    for run_id, seqs in wanted.items():
        for seq, rid in con.execute(
                "SELECT seq, request_id FROM request_ids WHERE run_id = ? AND seq IN"
                " (SELECT unnest(?::BIGINT[]))", [run_id, sorted(seqs)]).fetchall():
            names[run_id, seq] = rid
    for s in steps_:
        run = s["run_id"]
        s["decode_ids"] = [_name(names, run, q) for q in s.pop("decode_seqs") or ()]
        s["prefill_ids"] = [_name(names, run, q) for q in s.pop("prefill_seqs") or ()]
    return steps_


def _name(names: dict[tuple[str, int], str | None], run: str, seq: int | None) -> str | None:
    """A request number's id; "#seq" when request_ids lost it; None (another tenant's) stays."""
    return None if seq is None else names.get((run, seq), f"#{seq}")


def steps_around(con, at: float, before: int = 5, after: int = 5) -> list[dict[str, Any]]:
    """The steps just before and after a moment, with their batch composition."""
    if before < 0 or after < 0 or before + after > MAX_ROWS:
        raise ValueError("before and after must be >= 0 and add up to at most"
                         f" {MAX_ROWS}")
    cols = STEP_COLUMNS + ", " + BATCH_COLUMNS
    earlier = _rows(con, f"SELECT {cols} FROM steps WHERE start_time <= ?"
                    f" ORDER BY start_time DESC LIMIT {before}", [at]) if before else []
    later = _rows(con, f"SELECT {cols} FROM steps WHERE start_time > ?"
                  f" ORDER BY start_time LIMIT {after}", [at]) if after else []
    return _with_request_ids(con, earlier[::-1] + later)


def request_timeline(con, request_id: str) -> dict[str, Any] | None:
    """Everything recorded about one request, in time order; None if it is unknown.
    `request_id` may be a trace id (32 hex digits, control/otel): its newest request, with
    `trace_requests` naming every request of the trace (at most TRACE_REQUESTS)."""
    req = _rows(con, "SELECT * FROM requests WHERE request_id = ? ORDER BY finished_time"
                " DESC LIMIT 1", [request_id])
    in_trace: list[str] = []
    if not req and TRACE_ID.fullmatch(request_id):
        req = _rows(con, "SELECT * FROM requests WHERE trace_id = ? ORDER BY finished_time"
                    f" DESC LIMIT {TRACE_REQUESTS}", [request_id])
        in_trace = [r["request_id"] for r in req]
        req, request_id = req[:1], req[0]["request_id"] if req else request_id
    admissions = _rows(con, "SELECT time, kind, reason, message, lane, tenant, priority,"
                       " retry_after_s, estimated_wait_s, wait_s, wait_reasons, run_id"
                       " FROM admissions WHERE request_id = ? ORDER BY time", [request_id])
    if not req and not admissions:
        return None
    record = req[0] if req else None
    run_id = record["run_id"] if record else admissions[0]["run_id"]
    lo = record["arrival_time"] if record else admissions[0]["time"]
    hi = record["finished_time"] if record and record["finished_time"] else None
    where, params = time_window("start_time", lo, hi)
    seq = con.execute("SELECT seq FROM request_ids WHERE run_id = ? AND request_id = ?",
                      [run_id, request_id]).fetchone()
    ran = []
    if seq is not None:
        ran = _rows(con, f"""
            SELECT step_id, start_time, end_time,
                   CASE WHEN list_contains(decode_seqs, ?) THEN 'decode'
                        WHEN list_contains(prefill_seqs, ?) THEN 'prefill' END AS phase,
                   CASE WHEN list_contains(decode_seqs, ?) THEN 1
                        ELSE prefill_tokens[list_position(prefill_seqs, ?)] END AS tokens,
                   list_contains(preempted, ?) AS preempted_here,
                   num_prefill_seqs + num_decode_seqs AS batch_seqs, tokens_used, kv_usage
            FROM steps
            WHERE run_id = ? AND {where} AND (list_contains(decode_seqs, ?)
                  OR list_contains(prefill_seqs, ?) OR list_contains(preempted, ?))
            ORDER BY start_time""", [seq[0]] * 4 + [request_id, run_id] + params
                    + [seq[0], seq[0], request_id])
    return {"request_id": request_id, "request": record, "admissions": admissions,
            "steps": ran, "events": _events(record, admissions, ran),
            "breakdown": _breakdown(record), "trace_requests": in_trace}


def _events(record: dict | None, admissions: list[dict], ran: list[dict]) -> list[dict]:
    events = [{"time": a["time"], "event": a["kind"], "detail": a["reason"]}
              for a in admissions]
    if record:
        for name in ("arrival_time", "first_scheduled_time", "first_token_time",
                     "finished_time"):
            if record[name] is not None:
                detail = record["finish_reason"] if name == "finished_time" else ""
                events.append({"time": record[name], "event": name.removesuffix("_time"),
                               "detail": detail})
    events += [{"time": s["start_time"], "event": "preempted", "detail": f"step {s['step_id']}"}
               for s in ran if s["preempted_here"]]
    order = {"arrival": 0, "admitted": 1, "rejected": 1}
    return sorted(events, key=lambda e: (e["time"], order.get(e["event"], 2)))


def _breakdown(record: dict | None) -> dict[str, Any] | None:
    """Where the request's time went: queue, prefill, decode (and, inside those two, time
    re-queued after preemption), with the queue's reasons."""
    if record is None:
        return None
    return {"e2e_s": record["e2e_s"], "queue_s": record["queue_delay_s"],
            "prefill_s": record["prefill_time_s"], "decode_s": record["decode_time_s"],
            "preempted_s": record["preempted_s"], "wait_reasons": record["wait_reasons"],
            "num_preemptions": record["num_preemptions"]}


def latency(con, since: float | None = None, until: float | None = None,
            by: str = "lane") -> list[dict[str, Any]]:
    """Per group (lane, tenant, outcome or model): counts, percentiles, mean breakdown."""
    if by not in GROUPS:
        raise ValueError(f"by={by!r} must be one of {', '.join(GROUPS)}")
    where, params = time_window("finished_time", since, until)
    ran = "FILTER (WHERE outcome <> 'rejected')"  # a rejection's e2e is 0: not a latency
    pcts = ", ".join(
        f"quantile_cont({c}, 0.5) {ran} AS {c}_p50, quantile_cont({c}, 0.9) {ran} AS {c}_p90,"
        f" quantile_cont({c}, 0.99) {ran} AS {c}_p99" for c in LATENCIES)
    return _rows(con, f"""
        SELECT {by} AS "group", count(*) AS requests,
               count(*) FILTER (WHERE outcome = 'finished') AS finished,
               count(*) FILTER (WHERE outcome = 'rejected') AS rejected,
               count(*) FILTER (WHERE outcome IN ('cancelled', 'timeout', 'error')) AS failed,
               {pcts},
               avg(queue_delay_s) AS queue_s_mean, avg(prefill_time_s) AS prefill_s_mean,
               avg(decode_time_s) AS decode_s_mean, avg(preempted_s) AS preempted_s_mean,
               sum(num_output_tokens) AS output_tokens
        FROM requests WHERE {where} GROUP BY {by} ORDER BY {by}""", params)


def kv_usage(con, since: float | None = None, until: float | None = None,
             bucket_s: float = 10.0) -> dict[str, Any]:
    """KV usage over time (per bucket, from every step) and the snapshots by lane/tenant."""
    if not MIN_BUCKET_S <= bucket_s <= MAX_BUCKET_S:  # nan fails too; a tiny one made inf
        raise ValueError(f"bucket_s={bucket_s} must be in {MIN_BUCKET_S}..{MAX_BUCKET_S}")
    where, params = time_window("start_time", since, until)
    series = _rows(con, f"""
        SELECT floor(start_time / ?) * ? AS time, avg(kv_usage) AS usage_mean,
               max(kv_usage) AS usage_max, max(kv_blocks_used) AS blocks_used_max,
               avg(kv_blocks_cached) AS blocks_cached_mean, count(*) AS steps
        FROM steps WHERE {where} GROUP BY 1 ORDER BY 1 LIMIT {MAX_ROWS}""",
                   [bucket_s, bucket_s] + params)
    where, params = time_window("time", since, until)
    snaps = _rows(con, f"SELECT time, step_id, trigger, used, free, cached, total, usage,"
                  f" high_watermark, reject_watermark, by_lane, by_tenant FROM kv_snapshots"
                  f" WHERE {where} ORDER BY time LIMIT {MAX_ROWS}", params)
    return {"bucket_s": bucket_s, "series": series, "snapshots": snaps}


def slow(con, since: float | None = None, until: float | None = None, limit: int = 10,
         by: str = "e2e_s") -> list[dict[str, Any]]:
    """The slowest requests and where their time went."""
    if by not in SLOW_BY:
        raise ValueError(f"by={by!r} must be one of {', '.join(SLOW_BY)}")
    where, params = time_window("finished_time", since, until)
    rows = _rows(con, f"""
        SELECT run_id, request_id, lane, tenant, outcome, finish_reason, e2e_s, ttft_s,
               tpot_s, queue_delay_s AS queue_s, prefill_time_s AS prefill_s,
               decode_time_s AS decode_s, preempted_s, num_preemptions, wait_reasons,
               num_prompt_tokens, num_output_tokens, arrival_time,
               coalesce(first_token_time, finished_time) AS first_token_or_end
        FROM requests WHERE {where} AND {by} IS NOT NULL
        ORDER BY {by} DESC LIMIT {checked_limit(limit)}""", params)
    for row in rows:  # the step sizes it waited through (engine/scheduling/goodput.py)
        run_id, start, end = row.pop("run_id"), row["arrival_time"], row.pop(
            "first_token_or_end")
        row["step_reasons"] = dict(con.execute(
            "SELECT step_reason, count(*) FROM steps WHERE run_id = ? AND step_reason IS NOT"
            " NULL AND start_time >= ? AND start_time < ? GROUP BY ALL ORDER BY 2 DESC",
            [run_id, start, end]).fetchall()) if start is not None and end is not None else {}
    return rows


def summary(con, since: float | None = None, until: float | None = None) -> dict[str, Any]:
    where, params = time_window("start_time", since, until)
    step = _rows(con, f"""
        SELECT count(*) AS steps, min(start_time) AS first, max(end_time) AS last,
               sum(num_prefill_tokens) AS prefill_tokens, sum(num_decode_tokens)
               AS decode_tokens, sum(len(preempted)) AS preemptions,
               avg(duration_s) AS step_s_mean, quantile_cont(duration_s, 0.99) AS step_s_p99,
               max(kv_usage) AS kv_usage_max, avg(kv_usage) AS kv_usage_mean,
               avg(tokens_used / token_budget) AS budget_use_mean,
               count(DISTINCT config_version) AS config_versions
        FROM steps WHERE {where}""", params)[0]
    busy = (step["last"] or 0) - (step["first"] or 0)
    step["tokens_per_s"] = ((step["prefill_tokens"] or 0) + (step["decode_tokens"] or 0)) / \
        busy if busy > 0 else None
    rwhere, rparams = time_window("finished_time", since, until)
    outcomes = _rows(con, f"SELECT outcome, finish_detail AS reason, count(*) AS requests"
                     f" FROM requests WHERE {rwhere} GROUP BY ALL ORDER BY 3 DESC", rparams)
    overall = latency(con, since, until, by="model")
    awhere, aparams = time_window("time", since, until)
    waits = _rows(con, f"SELECT reason, count(*) AS waits, sum(wait_s) AS wait_s FROM"
                  f" admissions WHERE kind IN ('queued', 'requeued') AND wait_s > 0"
                  f" AND {awhere}"
                  f" GROUP BY reason ORDER BY wait_s DESC", aparams)
    # admitted with a reason: slo_deferred (behind the requests that can still meet their
    # SLO: slo_unreachable defer, or a client's resend; engine/lanes/admission.py)
    deferred = _rows(con, f"SELECT reason, count(*) AS requests FROM admissions WHERE kind ="
                     f" 'admitted' AND reason <> '' AND {awhere} GROUP BY reason"
                     f" ORDER BY 2 DESC", aparams)
    changes = _rows(con, f"SELECT time, version, source, actor, change FROM config_changes"
                    f" WHERE {awhere} ORDER BY time", aparams)
    runs = _rows(con, "SELECT run_id, started, model FROM runs ORDER BY started", [])
    return {"since": since, "until": until, "steps": step, "outcomes": outcomes,
            "deferred": deferred, "latency": overall, "waits": waits,
            "config_changes": changes, "runs": runs}
