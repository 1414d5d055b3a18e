"""Altair charts for the pages: one look answers one question. Data come in as the trace
API's rows (lists of dicts); times are epoch seconds, shown in the viewer's local time.

Every time chart can carry the config changes as dashed vertical rules whose tooltip is
the change's diff, so a shift in a curve lines up with the change that caused it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

HEIGHT = 220
QUANTILE_DASH = {"p50": [1, 0], "p95": [6, 3], "p99": [2, 2]}
QUANTILE_KEY = "p50 solid, p95 dashed, p99 dotted"  # QUANTILE_DASH in words, for titles


CLOCK = "%H:%M:%S"  # every time label: a 24-hour clock, to the second


def time_x() -> alt.X:
    """The time axis of every chart: a 24-hour clock (Vega's default labels minutes on a
    12-hour clock without AM/PM, so 16:50 read "04:50")."""
    return alt.X("time:T", title=None, axis=alt.Axis(format=CLOCK))


def time_tip() -> alt.Tooltip:
    return alt.Tooltip("time:T", format=CLOCK)


def frame(rows: Sequence[dict[str, Any]], time_column: str = "time") -> pd.DataFrame:
    """Rows as a DataFrame with `time` as a datetime (UTC epoch seconds in)."""
    df = pd.DataFrame(list(rows))
    if not df.empty and time_column in df:
        df[time_column] = pd.to_datetime(df[time_column], unit="s", utc=True)
    return df


def changes_frame(changes: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """config_changes rows with a one-line `diff` for tooltips."""
    df = frame(changes)
    if df.empty:
        return df
    df["diff"] = [diff_text(c) for c in df["change"]]
    return df


def diff_text(change: str | dict | None) -> str:
    try:
        diff = json.loads(change) if isinstance(change, str) else (change or {})
    except ValueError:
        return str(change)
    return "; ".join(f"{k}: {old} -> {new}" for k, (old, new) in diff.items()) or "-"


def change_rules(changes: pd.DataFrame) -> alt.Chart | None:
    if not changes.empty and "source" in changes:  # a what-if prediction changed nothing
        changes = changes[changes["source"] != "whatif"]
    if changes.empty:
        return None
    return alt.Chart(changes).mark_rule(strokeDash=[4, 4], color="#b45309").encode(
        x=time_x(), tooltip=[time_tip(), "version:Q",
                             "source:N", "actor:N", "diff:N"])


def with_changes(chart: alt.Chart, changes: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    rules = change_rules(changes)
    return chart if rules is None else alt.layer(chart, rules)


def quantile_lines(df: pd.DataFrame, metric: str, title: str,
                   changes: pd.DataFrame) -> alt.Chart | None:
    """p50/p95/p99 of `metric` (columns metric_p50 ...) over time, a colour per group."""
    cols = [f"{metric}_p{q}" for q in (50, 95, 99)]
    if df.empty or not set(cols) <= set(df.columns):
        return None
    long = df.melt(id_vars=["time", "group"], value_vars=cols, var_name="quantile",
                   value_name="seconds").dropna(subset=["seconds"])
    long["quantile"] = long["quantile"].str.rsplit("_", n=1).str[-1]
    chart = alt.Chart(long, title=title, height=HEIGHT).mark_line(point=True).encode(
        x=time_x(),
        y=alt.Y("seconds:Q", title="seconds"),
        color=alt.Color("group:N", title=None),
        # no legend: its symbols drew as blank (the points' circles, or nothing) and a
        # column of three ran past the chart's height; QUANTILE_KEY in the title says it
        strokeDash=alt.StrokeDash("quantile:N", scale=alt.Scale(
            domain=list(QUANTILE_DASH), range=list(QUANTILE_DASH.values())), legend=None),
        tooltip=[time_tip(), "group:N", "quantile:N",
                 alt.Tooltip("seconds:Q", format=".3f")])
    return with_changes(chart, changes)


def stacked_area(df: pd.DataFrame, columns: dict[str, str], title: str, y_title: str,
                 changes: pd.DataFrame, budget: str | None = None) -> alt.Chart | None:
    """`columns` (column -> legend name) stacked over time; `budget` a line on top."""
    if df.empty:
        return None
    long = df.melt(id_vars=["time"], value_vars=list(columns), var_name="kind",
                   value_name="value")
    long["kind"] = long["kind"].map(columns)
    chart = alt.Chart(long, title=title, height=HEIGHT).mark_area(opacity=0.75).encode(
        x=time_x(), y=alt.Y("value:Q", title=y_title, stack=True),
        color=alt.Color("kind:N", title=None),
        tooltip=[time_tip(), "kind:N",
                 alt.Tooltip("value:Q", format=",.1f")])
    layers = [chart]
    if budget is not None and budget in df:
        layers.append(alt.Chart(df).mark_line(color="black", strokeDash=[6, 3]).encode(
            x=time_x(), y=f"{budget}:Q",
            tooltip=[alt.Tooltip(f"{budget}:Q", title="token budget")]))
    rules = change_rules(changes)
    if rules is not None:
        layers.append(rules)
    return alt.layer(*layers) if len(layers) > 1 else chart


def lines(df: pd.DataFrame, key: str, value: str, title: str, y_title: str,
          changes: pd.DataFrame, fmt: str = ",.2f") -> alt.Chart | None:
    """One line per value of `key` (long format)."""
    if df.empty:
        return None
    # all zeros (nobody waited): a 0-1 scale, where Vega's own labels its one tick 0.000000
    scale = alt.Scale(domain=[0, 1]) if not df[value].abs().max() else alt.Undefined
    chart = alt.Chart(df, title=title, height=HEIGHT).mark_line(point=len(df) < 50).encode(
        x=time_x(), y=alt.Y(f"{value}:Q", title=y_title, scale=scale),
        color=alt.Color(f"{key}:N", title=None),
        tooltip=[time_tip(), f"{key}:N",
                 alt.Tooltip(f"{value}:Q", format=fmt)])
    return with_changes(chart, changes)


def kv_usage(df: pd.DataFrame, high: float | None, reject: float | None,
             changes: pd.DataFrame) -> alt.Chart | None:
    """KV usage (max and mean per bucket) against the high and reject watermarks."""
    if df.empty:
        return None
    long = df.melt(id_vars=["time"], value_vars=["kv_usage_max", "kv_usage_mean"],
                   var_name="kind", value_name="usage")
    long["kind"] = long["kind"].map({"kv_usage_max": "max", "kv_usage_mean": "mean"})
    chart = alt.Chart(long, title="KV cache usage", height=HEIGHT).mark_line().encode(
        x=time_x(),
        y=alt.Y("usage:Q", title="share of blocks", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title=None),
        tooltip=[time_tip(), "kind:N",
                 alt.Tooltip("usage:Q", format=".1%")])
    marks = pd.DataFrame([{"line": name, "usage": value} for name, value in
                          (("high watermark", high), ("reject watermark", reject))
                          if value is not None])
    layers = [chart]
    if not marks.empty:
        layers.append(alt.Chart(marks).mark_rule(strokeDash=[6, 3]).encode(
            y="usage:Q", color=alt.Color("line:N", scale=alt.Scale(
                domain=["high watermark", "reject watermark"], range=["#d97706", "#dc2626"]),
                title=None), tooltip=["line:N", alt.Tooltip("usage:Q", format=".0%")]))
    rules = change_rules(changes)
    if rules is not None:
        layers.append(rules)
    return alt.layer(*layers).resolve_scale(color="independent")


def bars(df: pd.DataFrame, y: str, color: str | None, title: str, y_title: str,
         changes: pd.DataFrame) -> alt.Chart | None:
    if df.empty:
        return None
    enc: dict[str, Any] = {"x": time_x(),
                           "y": alt.Y(f"sum({y}):Q", title=y_title),
                           "tooltip": [time_tip(),
                                       alt.Tooltip(f"sum({y}):Q", title=y_title)]}
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=None)
        enc["tooltip"].append(f"{color}:N")
    chart = alt.Chart(df, title=title, height=HEIGHT).mark_bar().encode(**enc)
    return with_changes(chart, changes)


def breakdown(parts: dict[str, float], title: str) -> alt.Chart:
    """One horizontal stacked bar: where a request's time went, in `parts`' order."""
    df = pd.DataFrame([{"part": k, "seconds": v} for k, v in parts.items() if v])
    # fit to the width only: fitted to a height as well, the title, legend and axis took
    # it all and the bar got none (at 70 px), or the axis was cut off
    return alt.Chart(df, title=title, height=40).mark_bar(size=28).encode(
        x=alt.X("sum(seconds):Q", title="seconds"),
        color=alt.Color("part:N", title=None, sort=list(parts),
                        legend=alt.Legend(orient="top", direction="horizontal")),
        order=alt.Order("part_order:Q"),
        tooltip=["part:N", alt.Tooltip("seconds:Q", format=".3f")]).transform_calculate(
        part_order=f"indexof({list(parts)!r}, datum.part)").properties(
        autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def millisecond_time(date: bool = True) -> Any:
    """A table column of UTC datetimes shown to the millisecond (a step lasts a few ms;
    Streamlit's default shows whole seconds)."""
    import streamlit as st

    return st.column_config.DatetimeColumn(
        format="YYYY-MM-DD HH:mm:ss.SSS" if date else "HH:mm:ss.SSS")


def show(chart: alt.Chart | None, empty: str) -> None:
    import streamlit as st

    if chart is None:
        st.info(empty)
    else:
        st.altair_chart(chart, width="stretch")
