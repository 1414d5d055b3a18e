"""Overview: what users feel (TTFT, TPOT, queue delay, E2E percentiles over time, by lane
or tenant), the work done (prefill vs decode tokens/s) and what went wrong (rejections,
deferrals, timeouts and cancels by reason)."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard.context import ask, ask_shared, context, window

ctx = context()
since, until = window(ctx)
by = st.sidebar.radio("Group latency by", ["lane", "tenant"], horizontal=True, key="bp_by")
st.title("Overview")

summary = ask(ctx, "summary", since=since, until=until)
steps = summary["steps"]
overall = summary["latency"][0] if summary["latency"] else {}
done = {row["outcome"]: row["requests"] for row in summary["outcomes"]}
cols = st.columns(7)
cols[0].metric("Requests", sum(done.values()))
cols[1].metric("TTFT p99", f"{overall.get('ttft_s_p99') or 0:.2f} s")
cols[2].metric("E2E p99", f"{overall.get('e2e_s_p99') or 0:.2f} s")
cols[3].metric("Tokens/s", f"{steps.get('tokens_per_s') or 0:,.0f}")
cols[4].metric("Rejected", done.get("rejected", 0))
cols[5].metric("Deferred", sum(row["requests"] for row in summary.get("deferred", [])),
               help="Admitted behind every request that can still meet its SLO: the queue"
               " already kept it from its lane's TTFT target (slo_unreachable: defer), or its"
               " client sent it again after a refusal. Served late, not refused.")
cols[6].metric("Timeouts + cancels", done.get("timeout", 0) + done.get("cancelled", 0))
if not steps.get("steps"):
    st.info("No steps in this window: the engine has not run anything yet (or choose a"
            " wider window).")

changes = charts.changes_frame(ask_shared(ctx, "config_changes", since=since,
                                           until=until))
latency = charts.frame(ask(ctx, "series_latency", since=since, until=until, buckets=120,
                           by=by)["rows"])
left, right = st.columns(2)
for i, (metric, title) in enumerate((("ttft_s", "Time to first token"),
                                     ("tpot_s", "Time per output token"),
                                     ("queue_delay_s", "Queue delay"),
                                     ("e2e_s", "End-to-end latency"))):
    with (left if i % 2 == 0 else right):
        heading = f"{title} by {by} ({charts.QUANTILE_KEY})"
        charts.show(charts.quantile_lines(latency, metric, heading, changes),
                    f"No finished requests for {title}.")

step_rows = charts.frame(ask(ctx, "series_steps", since=since, until=until,
                             buckets=300)["rows"])
outcomes = charts.frame(ask(ctx, "series_outcomes", since=since, until=until,
                            buckets=120)["rows"])
left, right = st.columns(2)
with left:
    charts.show(charts.stacked_area(step_rows, {"prefill_tps": "prefill",
                                                "decode_tps": "decode"},
                                    "Prefill vs decode tokens/s", "tokens/s", changes),
                "No steps in this window.")
with right:
    if not outcomes.empty:
        outcomes["what"] = outcomes["outcome"] + ": " + outcomes["reason"]
    charts.show(charts.bars(outcomes, "requests", "what",
                            "Refused, deferred, timed out and cancelled, by reason",
                            "requests", changes),
                "No refusals, deferrals, timeouts or cancels in this window.")
if not changes.empty:
    st.caption("Dashed amber lines: config changes (hover for the diff).")
