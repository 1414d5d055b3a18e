"""Every outcome is counted where the trace summarizes them: `trace summary`'s outcomes and
the report's cohort columns (finished, rejected, failed: cancelled and timed out too)."""

from __future__ import annotations

import duckdb
from fixtures.trace_data import fill_trace

from control.trace import queries, report_queries


def test_summary_and_cohorts_count_every_outcome(tmp_path):
    path = str(tmp_path / "trace.duckdb")
    fill_trace(path).stop()  # 7 finished, `big` rejected, r5 cancelled
    con = duckdb.connect(path)
    try:
        con.execute("UPDATE requests SET outcome = 'timeout', finish_detail = NULL"
                    " WHERE request_id IN ('r0', 'r1')")
        outcomes = {o["outcome"]: o["requests"] for o in queries.summary(con)["outcomes"]}
        assert outcomes == {"finished": 5, "timeout": 2, "rejected": 1, "cancelled": 1}
        every = report_queries.cohort_latency(con)["all"]
        assert (every["requests"], every["finished"], every["rejected"], every["failed"]) \
            == (9, 5, 1, 3)
    finally:
        con.close()
