"""The what-if's capacity sweep in the dashboard: every config at each rate scale (the
recorded requests arriving that many times as fast; control/whatif/capacity.py), as a
sentence per config (its capacity), goodput and p99 TTFT against rate, and the table.

    rates = parse_rates(scale_text, sweep_text)    # WhatifError naming the field
    show_capacity(result["capacity"])

The frames are pure functions of the result, tested without Streamlit."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from control.whatif.capacity import check_rate, check_replicas, parse_sweep
from control.whatif.cli import WhatifError

COLUMNS = {"rate_scale": "rate x", "offered_rps": "offered /s", "goodput_rps": "goodput /s",
           "met_share_of_offered": "met SLO (of offered)", "finished": "finished",
           "rejected": "rejected", "timeout": "timeout", "ttft_p99_s": "TTFT p99 s",
           "e2e_p99_s": "E2E p99 s"}


def parse_rates(scale: float, sweep_text: str, replicas: int = 1) -> dict[str, Any]:
    """The form's rate scale (a number), sweep ("0.5, 1, 2": empty for none) and replica
    count as predict takes them; WhatifError (2) naming the field when one is bad."""
    out: dict[str, Any] = {}
    try:
        if scale != 1.0:
            out["rate_scale"] = check_rate(scale, "rate scale")
        if replicas != 1:
            out["replicas"] = check_replicas(replicas, "replicas")
        if sweep_text.strip():
            out["rate_sweep"] = parse_sweep(sweep_text, "rate sweep")
    except ValueError as exc:
        raise WhatifError(str(exc), 2) from None
    return out


def capacity_frame(capacity: dict[str, Any]) -> pd.DataFrame:
    """Long format: one row per (config, rate) with COLUMNS' figures."""
    rows = [{"config": name, **{label: r[key] for key, label in COLUMNS.items()}}
            for name, by_rate in capacity["configs"].items() for r in by_rate]
    return pd.DataFrame(rows)


def capacity_sentences(capacity: dict[str, Any]) -> list[str]:
    share, rates = capacity["met_share_for_capacity"], capacity["rates"]
    out = []
    for name, cap in capacity["capacity"].items():
        if cap is None:
            said = f"below {share:.0%} meeting their SLO already at {rates[0]:g}x"
        else:  # the highest swept rate is a floor: a higher one was not tried
            said = (f"carries {'at least ' if cap == rates[-1] else ''}**{cap:g}x** the"
                    f" recorded rate with {share:.0%} of requests meeting their SLO")
        out.append(f"**{name}**: {said}")
    return out


def capacity_charts(df: pd.DataFrame) -> alt.HConcatChart:
    """Goodput (with the offered rate, dashed) and p99 TTFT against the rate scale, one
    colour per config."""
    x = alt.X("rate x:Q", title="x the recorded rate")
    colour = alt.Color("config:N", title=None, scale=alt.Scale(scheme="tableau10"),
                       legend=alt.Legend(orient="bottom"))
    good = alt.Chart(df, title="goodput (requests meeting their SLO /s)", width=380,
                     height=240).mark_line(point=True).encode(
        x=x, y=alt.Y("goodput /s:Q", title="requests / s"), color=colour,
        tooltip=["config:N", "rate x:Q", alt.Tooltip("goodput /s:Q", format=".3f")])
    offered = alt.Chart(df.drop_duplicates("rate x")).mark_line(
        strokeDash=[4, 4], color="grey").encode(x=x, y="offered /s:Q")
    ttft = alt.Chart(df, title="TTFT p99 (s)", width=380, height=240).mark_line(
        point=True).encode(x=x, y=alt.Y("TTFT p99 s:Q", title="seconds"), color=colour,
                           tooltip=["config:N", "rate x:Q",
                                    alt.Tooltip("TTFT p99 s:Q", format=".3f")])
    return alt.hconcat(good + offered, ttft)


def show_capacity(capacity: dict[str, Any]) -> None:
    st.subheader("Capacity")
    st.caption("Every config replayed on the window's requests arriving at each rate scale"
               " (the same requests, their arrival gaps divided by it). Capacity: the"
               " highest rate up to which at least"
               f" {capacity['met_share_for_capacity']:.0%} of the offered requests met"
               " their SLO.")
    st.markdown("  \n".join(capacity_sentences(capacity)))
    df = capacity_frame(capacity)
    st.altair_chart(capacity_charts(df), width="content")
    st.dataframe(df, hide_index=True, width="stretch")
