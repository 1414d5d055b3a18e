"""Requests: the slowest requests of the window, and one request's timeline step by step
(queued, admitted, prefill chunks, decode steps, preemptions, finish) with where its time
went."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from control.trace.format_request import routing_sentence
from dashboard import charts
from dashboard.context import ask, columns, context, window

SLOW_BY = {"end-to-end": "e2e_s", "time to first token": "ttft_s",
           "queue delay": "queue_delay_s", "time per output token": "tpot_s"}

ctx = context()
since, until = window(ctx)
st.title("Requests")

left, right = st.columns([2, 1])
by = left.selectbox("Slowest by", list(SLOW_BY), key="bp_slow_by")
limit = right.number_input("How many", 5, 200, 20, step=5, key="bp_slow_limit")
slow = ask(ctx, "slow", since=since, until=until, limit=int(limit), by=SLOW_BY[by])
if not slow:
    st.info("No finished requests in this window.")
table = charts.frame(slow, "arrival_time")
if not table.empty:
    st.dataframe(table[columns(table, [
        "request_id", "lane", "tenant", "outcome", "e2e_s", "ttft_s", "tpot_s", "queue_s",
        "prefill_s", "decode_s", "preempted_s", "num_preemptions", "num_prompt_tokens",
        "num_output_tokens", "arrival_time"])], hide_index=True, height=280)

st.subheader("One request")
choices = [row["request_id"] for row in slow]
typed = st.text_input("Request id (or pick one of the slowest below)", key="bp_request_id")
picked = st.selectbox("Slowest", choices, key="bp_request_pick") if choices else None
request_id = typed.strip() or picked
if not request_id:
    st.stop()
timeline = ask(ctx, "request", request_id=request_id)
record, breakdown = timeline.get("request"), timeline.get("breakdown")
routed = routing_sentence(record, timeline.get("replica")) if record else None
if routed:  # a fleet replica's record: where its ingress sent it, and why
    st.caption(routed[0].upper() + routed[1:])
elif timeline.get("replica") is not None:  # a fleet's trace files: the replica that ran it
    st.caption(f"Ran on replica {timeline['replica']}")
if record:
    cols = st.columns(5)
    cols[0].metric("Outcome", record["outcome"], record.get("finish_reason") or None,
                   delta_color="off")
    cols[1].metric("E2E", f"{record['e2e_s'] or 0:.2f} s")
    cols[2].metric("TTFT", f"{record['ttft_s'] or 0:.2f} s")
    cols[3].metric("Tokens in / out", f"{record['num_prompt_tokens']} / "
                   f"{record['num_output_tokens']}")
    cols[4].metric("Preemptions", record["num_preemptions"])
if breakdown:
    parts = {"queued": breakdown["queue_s"], "prefill": breakdown["prefill_s"],
             "decode": breakdown["decode_s"]}
    st.altair_chart(charts.breakdown(parts, "Where the time went"), width="stretch")
    if breakdown.get("wait_reasons"):
        st.caption("Queued because: " + ", ".join(
            f"{k} {v:.2f} s" for k, v in breakdown["wait_reasons"].items()))

steps = pd.DataFrame(timeline["steps"])
if not steps.empty:
    t0 = steps["start_time"].min()
    steps["t (s)"] = steps["start_time"] - t0
    chart = alt.Chart(steps, title="Its steps: tokens it ran in each", height=200).mark_bar(
    ).encode(x=alt.X("t (s):Q", title="seconds since its first step"),
             y=alt.Y("tokens:Q"), color=alt.Color("phase:N", title=None),
             tooltip=["step_id:Q", "phase:N", "tokens:Q", "batch_seqs:Q", "tokens_used:Q",
                      alt.Tooltip("kv_usage:Q", format=".1%"), "preempted_here:N"])
    st.altair_chart(chart, width="stretch")
events = pd.DataFrame(timeline["events"])
if not events.empty:  # milliseconds: a request's events are often within one second
    origin = (record or {}).get("arrival_time") or events["time"].min()
    events.insert(0, "since arrival (ms)", (events["time"] - origin) * 1000)
    events["time"] = pd.to_datetime(events["time"], unit="s", utc=True)
    events = events.rename(columns={"time": "time (UTC)"})
st.dataframe(events, hide_index=True, column_config={
    "since arrival (ms)": st.column_config.NumberColumn(format="%+.1f"),
    "time (UTC)": charts.millisecond_time(date=False)})
with st.expander("Every step it ran in"):
    st.dataframe(steps, hide_index=True)
