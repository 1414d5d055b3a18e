"""Scheduler: the per-step timeline. Batch composition against the token budget, running
and waiting by lane (and why requests wait), KV usage against the watermarks,
preemptions, step time; config changes marked on every chart with their diff on hover."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import charts
from dashboard.context import ask, ask_shared, columns, context, window

ctx = context()
since, until = window(ctx)
st.title("Scheduler")

changes = charts.changes_frame(ask_shared(ctx, "config_changes", since=since,
                                           until=until))
series = ask(ctx, "series_steps", since=since, until=until, buckets=300)
rows = charts.frame(series["rows"])
if rows.empty:
    st.info("No steps in this window.")
    st.stop()
st.caption(f"Each point is a {series['bucket_s']:g} s bucket; dashed amber lines are config"
           " changes (hover for the diff).")
rows["prefill per step"] = rows["prefill_tokens"] / rows["steps"]
rows["decode per step"] = rows["decode_tokens"] / rows["steps"]
charts.show(charts.stacked_area(
    rows, {"prefill per step": "prefill tokens", "decode per step": "decode tokens"},
    "Batch composition: tokens per step (mean) against the token budget", "tokens",
    changes, budget="token_budget"), "No steps.")

queues = ask(ctx, "series_queues", since=since, until=until, buckets=300)
left, right = st.columns(2)
for column, name in ((left, "running"), (right, "waiting")):
    with column:
        df = charts.frame(queues[name])
        charts.show(charts.lines(df, "key", "mean", f"{name.capitalize()} by lane (mean)",
                                 "requests", changes), f"Nothing {name}.")

kv = ask(ctx, "kv", since=since, until=until, bucket_s=float(series["bucket_s"]))
snaps = kv["snapshots"]
high = snaps[-1]["high_watermark"] if snaps else None
reject = snaps[-1]["reject_watermark"] if snaps else None
left, right = st.columns(2)
with left:
    charts.show(charts.kv_usage(rows, high, reject, changes), "No KV data.")
with right:
    reasons = charts.frame(queues["waiting_by_reason"])
    charts.show(charts.lines(reasons, "key", "mean", "Waiting by reason (mean)", "requests",
                             changes), "No request waited in this window.")

left, right = st.columns(2)
with left:
    preempted = rows if rows["preemptions"].sum() > 0 else rows.iloc[0:0]
    charts.show(charts.bars(preempted, "preemptions", None, "Preemptions", "preemptions",
                            changes), "No preemptions in this window.")
with right:
    step_s = rows.melt(id_vars=["time"], value_vars=["step_s_mean", "step_s_max"],
                       var_name="key", value_name="seconds")
    charts.show(charts.lines(step_s, "key", "seconds", "Step duration", "seconds", changes,
                             fmt=".4f"), "No steps.")

st.subheader("Individual steps")
st.caption("The latest steps of the window, one bar per step (up to 400).")
raw = charts.frame(ask(ctx, "steps", since=since, until=until, limit=400), "start_time")
if not raw.empty:
    raw = raw.sort_values("step_id").tail(400)
    long = raw.melt(id_vars=["step_id", "token_budget", "config_version"],
                    value_vars=["num_prefill_tokens", "num_decode_tokens"],
                    var_name="kind", value_name="tokens")
    long["kind"] = long["kind"].map({"num_prefill_tokens": "prefill",
                                     "num_decode_tokens": "decode"})
    bars_ = alt.Chart(long, height=charts.HEIGHT).mark_bar().encode(
        x=alt.X("step_id:O", title="step", axis=alt.Axis(labelOverlap=True)),
        y=alt.Y("tokens:Q", stack=True), color=alt.Color("kind:N", title=None),
        tooltip=["step_id:O", "kind:N", "tokens:Q", "token_budget:Q", "config_version:Q"])
    budget = alt.Chart(raw).mark_tick(color="black", thickness=2).encode(
        x="step_id:O", y="token_budget:Q")
    st.altair_chart(alt.layer(bars_, budget), width="stretch")
    st.dataframe(raw[columns(raw, [
        "step_id", "start_time", "duration_s", "num_prefill_seqs", "num_decode_seqs",
        "num_prefill_tokens", "num_decode_tokens", "token_budget", "kv_usage",
        "waiting_by_reason", "preempted", "config_version"])].iloc[::-1], hide_index=True,
                 height=300, column_config={"start_time": charts.millisecond_time()})
