"""Facts the go-live checklist (control/checklist/) needs from a trace DB, in two questions,
so the HTTP read API and a trace file give the same answers:

    checklist_facts(con)        the latest run's settings, the limits and watermarks its
                                steps and KV snapshots recorded, cancellations and the
                                first step after the last one in which nothing ran
    loadtest_stats(con, ...)    per load-test run and config: prompt and output length
                                spread, long prompts, cancellations

Either answers with what is there: a table that does not exist gives None or [].
"""

from __future__ import annotations

from typing import Any

from control.trace.queries import _rows, checked_limit

RUNNING = "coalesce(list_sum(map_values(running_by_lane)), 0)"  # requests running after a step


def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables"
                            " WHERE table_name = ?", [name]).fetchone()[0])


def _one(con, sql: str, params: list[Any]) -> dict[str, Any] | None:
    rows = _rows(con, sql, params)
    return rows[0] if rows else None


def checklist_facts(con) -> dict[str, Any]:
    """The latest run and what its trace says about config and KV; cancellations over
    every run, with the first step (in the same run) after the last one that ran nothing."""
    if not _has_table(con, "steps"):
        return {"run": None, "last_step": None, "last_kv_snapshot": None,
                "cancelled": 0, "last_cancel": None, "idle_after_cancel": None,
                "last_idle_step": None}
    run = _one(con, "SELECT run_id, started, model, settings FROM runs"
               " ORDER BY started DESC LIMIT 1", [])
    run_id = run["run_id"] if run else None
    last_step = _one(con, """
        SELECT step_id, start_time, max_num_seqs, token_budget,
               kv_blocks_used + kv_blocks_free AS kv_blocks_total,
               map_keys(running_by_lane) AS lanes, config_version
        FROM steps WHERE run_id = ? ORDER BY start_time DESC LIMIT 1""", [run_id])
    snapshot = _one(con, "SELECT step_id, time, total, high_watermark, reject_watermark"
                    " FROM kv_snapshots WHERE run_id = ? ORDER BY time DESC LIMIT 1", [run_id])
    cancelled = con.execute("SELECT count(*) FROM requests WHERE outcome = 'cancelled'"
                            ).fetchone()[0]
    last_cancel = _one(con, "SELECT run_id, request_id, finished_time FROM requests"
                       " WHERE outcome = 'cancelled' ORDER BY finished_time DESC LIMIT 1", [])
    idle_cols = ("step_id, end_time, kv_blocks_used, kv_blocks_cached, kv_blocks_free,"
                 " num_prefill_seqs + num_decode_seqs AS ran_seqs")
    idle_after = None
    if last_cancel is not None:
        idle_after = _one(con, f"""
            SELECT {idle_cols} FROM steps
            WHERE run_id = ? AND start_time >= ? AND {RUNNING} = 0
            ORDER BY start_time LIMIT 1""",
                          [last_cancel["run_id"], last_cancel["finished_time"]])
    last_idle = _one(con, f"SELECT {idle_cols} FROM steps WHERE run_id = ? AND {RUNNING} = 0"
                     " ORDER BY start_time DESC LIMIT 1", [run_id])
    return {"run": run, "last_step": last_step, "last_kv_snapshot": snapshot,
            "cancelled": cancelled, "last_cancel": last_cancel,
            "idle_after_cancel": idle_after, "last_idle_step": last_idle}


def loadtest_stats(con, long_prompt_tokens: int = 512, limit: int = 100
                   ) -> list[dict[str, Any]]:
    """Per listed (run, config label), newest first: requests, streamed, cancelled; prompt token
    mean / population stddev / min / max over requests the server counted (usage came
    back); the same for output tokens of ok requests; prompts of >= long_prompt_tokens."""
    if long_prompt_tokens < 1:
        raise ValueError(f"long_prompt_tokens={long_prompt_tokens} must be >= 1")
    limit = checked_limit(limit, 1000)
    if not _has_table(con, "loadtest_requests"):
        return []
    # only runs whose loadtest_runs row is stored: a save sends it last (results_body.py)
    listed = ("WHERE (run_id, label) IN (SELECT run_id, label FROM loadtest_runs)"
              if _has_table(con, "loadtest_runs") else "WHERE false")
    counted = "FILTER (WHERE prompt_tokens > 0)"
    outputs = "FILTER (WHERE outcome = 'ok' AND output_tokens > 0)"
    return _rows(con, f"""
        SELECT run_id, label, min(sent_at) AS first_sent, count(*) AS requests,
               count(*) FILTER (WHERE stream) AS streamed,
               count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
               count(*) {counted} AS prompts_counted,
               avg(prompt_tokens) {counted} AS prompt_mean,
               stddev_pop(prompt_tokens) {counted} AS prompt_std,
               min(prompt_tokens) {counted} AS prompt_min,
               max(prompt_tokens) {counted} AS prompt_max,
               count(*) {outputs} AS outputs_counted,
               avg(output_tokens) {outputs} AS output_mean,
               stddev_pop(output_tokens) {outputs} AS output_std,
               min(output_tokens) {outputs} AS output_min,
               max(output_tokens) {outputs} AS output_max,
               count(*) FILTER (WHERE prompt_tokens >= ?) AS long_prompts
        FROM loadtest_requests {listed} GROUP BY run_id, label
        ORDER BY first_sent DESC NULLS LAST, label
        LIMIT {limit}""", [long_prompt_tokens])
