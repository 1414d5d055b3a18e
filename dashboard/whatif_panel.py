"""What-if in the dashboard, shared by the Control page (Predict) and the What-if page.

    result = predict(ctx, since, until, {"proposed": patch}, slo)   # None: the error shown
    show(result)                                                   # warnings, table, charts

Live, the server predicts (`POST /v1/whatif`, with the control API's token: it replays in
a process of its own and records the prediction in its audit); over a trace file, this
process replays the file (as `batchpilot whatif --db` does). Every failure is one message
an operator can act on (tracing off, an empty window, a bad setting naming its field, a
server that cannot be reached), never a traceback. The table and charts are built from
the result by pure functions (`ratio_frame`, `latency_frame`), tested without Streamlit.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from control.cli.http_json import HTTPFailure, request_json
from control.loadtest.records import SLO
from control.whatif.cli import HTTP_TIMEOUT_S, WhatifError, proposals
from dashboard.capacity_panel import show_capacity
from dashboard.context import Ctx

AS_IS = "predicted as-is"  # how the `predicted` column (the recorded config replayed) shows
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
EMPTY_WINDOW = ("No request that ended arrived in this window, so there is nothing to"
                " replay: choose a wider window.")


def default_rows(config: dict[str, Any] | None) -> pd.DataFrame:
    """The What-if page's first configs: halves of the current budgets (a trace file,
    whose config is not known: of the defaults' order of magnitude)."""
    seqs = int((config or {}).get("max_num_seqs") or 32)
    chunk = int((config or {}).get("prefill_chunk_size") or 512)
    return pd.DataFrame([
        {"name": "fewer_seqs", "settings": f"max_num_seqs={max(seqs // 2, 1)}"},
        {"name": "smaller_chunk", "settings": f"prefill_chunk_size={max(chunk // 2, 16)}"}])


def parse_rows(records: list[dict[str, Any]]) -> dict[str, dict]:
    """{name, settings} rows -> {name: merge patch}, settings as `batchpilot whatif
    --compare` takes them (commas, with or without a space); WhatifError naming the row."""
    specs = []
    for record in records:
        name = str(record.get("name") or "").strip()
        settings = str(record.get("settings") or "").strip()
        if not name and not settings:
            continue  # an empty row the editor added
        if not name or not settings:
            raise WhatifError(f"row {name or settings!r} needs both a name and settings", 2)
        specs.append(name + ":" + re.sub(r",\s+(?=[A-Za-z_][\w.]*=)", ",", settings))
    return proposals(None, specs)


def problem(status: int | None, message: str, body: dict[str, Any]) -> str:
    """A refused or failed prediction, worded for the operator."""
    error = body.get("error") or {}
    if status is None:
        return f"Cannot reach the server for a prediction: {message}"
    if status == 404 and error.get("code") == "trace_off":
        return ("Tracing is off on this server, so there is no trace to predict from: start"
                " it with `--trace-db PATH` (`batchpilot serve --trace-db trace.duckdb`).")
    if status == 404:
        return f"This server has no what-if endpoint (POST /v1/whatif): {message}"
    if status == 400 and "no request arrived" in message:
        return EMPTY_WINDOW
    if status == 400:
        return f"Invalid `{error.get('param') or 'request'}`: {message}"
    if status in (401, 403):
        return f"The server refused the token ({status}): {message}"
    if status == 503:
        return "The server is still loading its model: try again in a moment."
    return f"The prediction failed (the server answered {status}): {message}"


def request_body(since: float | None, until: float | None, proposals: dict[str, dict],
                 slo: SLO | None, rates: dict[str, Any] | None = None) -> dict[str, Any]:
    """`proposed` goes as `set` (a 400 then names `set`), the others as `compare`;
    `rates`: rate_scale and rate_sweep (capacity_panel.parse_rates)."""
    body: dict[str, Any] = {"since": since, "until": until,
                            **{k: list(v) if isinstance(v, tuple) else v
                               for k, v in (rates or {}).items()}}
    others = {name: patch for name, patch in proposals.items() if name != "proposed"}
    if "proposed" in proposals:
        body["set"] = proposals["proposed"]
    if others:
        body["compare"] = others
    if slo is not None:
        body["slo"] = {k: v for k, v in vars(slo).items() if v is not None}
    return body


def predict(ctx: Ctx, since: float | None, until: float | None,
            proposals: dict[str, dict], slo: SLO | None = None,
            rates: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The prediction, or None after showing why there is none."""
    with st.spinner("Replaying the window under each config..."):
        if ctx.live:
            return _from_server(ctx, request_body(since, until, proposals, slo, rates))
        return _from_file(ctx, since, until, proposals, slo, rates or {})


def _from_server(ctx: Ctx, body: dict[str, Any]) -> dict[str, Any] | None:
    assert ctx.control is not None
    token = os.environ.get(ctx.token_env)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return request_json(ctx.control.url, "/v1/whatif", method="POST", body=body,
                            headers=headers, timeout_s=HTTP_TIMEOUT_S)
    except HTTPFailure as exc:
        st.error(problem(exc.status, exc.message, exc.body))
        return None


def _from_file(ctx: Ctx, since: float | None, until: float | None,
               proposals: dict[str, dict], slo: SLO | None, rates: dict[str, Any],
               ) -> dict[str, Any] | None:
    from control.trace.sources import TraceError
    from control.whatif.configs import base_config
    from control.whatif.run import predict as run_predict
    from control.whatif.window import read_window

    try:
        con = ctx.source.connect()
        try:
            window = read_window(con, since, until)
        finally:
            con.close()
        base, notes = base_config(window, None)
        return run_predict(window, base, proposals, slo=slo, notes=notes, **rates)
    except (TraceError, ValueError) as exc:
        text = str(exc)
        st.error(EMPTY_WINDOW if "no request arrived" in text else f"Invalid: {text}")
        return None


def _label(column: str) -> str:
    return AS_IS if column == "predicted" else column


def ratio_frame(result: dict[str, Any]) -> pd.DataFrame:
    """One row per metric: each column's value, then `as-is / recorded` (the prediction's
    own error) and `NAME / as-is` (the change each proposal makes; under a rate scale K,
    `NAME / as-is@Kx`: the recorded config at the same rate)."""
    columns = result["columns"]
    baseline = result.get("baseline", "predicted")
    base_label = "as-is" if baseline == "predicted" else baseline
    records = []
    for row in result["rows"]:
        record = {"metric": row["metric"]}
        record.update({_label(c): row["values"][c] for c in columns})
        for c in columns[1:]:
            if c == "predicted":
                record["as-is / recorded"] = row["ratios"][c]
            elif c != baseline:
                record[f"{c} / {base_label}"] = row["ratios"][c]
        records.append(record)
    return pd.DataFrame(records).set_index("metric")


def latency_frame(result: dict[str, Any], stats: tuple[str, ...] = ("p50", "p99")
                  ) -> pd.DataFrame:
    """Long format for the charts: config, latency (TTFT/TPOT/E2E), stat, seconds."""
    rows = [{"config": _label(c), "latency": label, "stat": s,
             "seconds": result["summaries"][c][name][s]}
            for c in result["columns"] for name, label in LATENCIES.items() for s in stats]
    return pd.DataFrame(rows).dropna(subset=["seconds"])


def latency_charts(df: pd.DataFrame, order: list[str]) -> alt.HConcatChart:
    """A panel per latency (own y scale), bars of p50 and p99 side by side, one colour per
    config (in `order`) and one legend for all three."""
    panels = []
    for latency in LATENCIES.values():
        part = df[df["latency"] == latency]
        panels.append(alt.Chart(part, title=f"{latency} (s)", width=250, height=220)
                      .mark_bar().encode(
            x=alt.X("stat:N", title=None, sort=["p50", "p99"], axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("config:N", sort=order),
            y=alt.Y("seconds:Q", title="seconds"),
            color=alt.Color("config:N", sort=order, title=None,
                            scale=alt.Scale(scheme="tableau10"),
                            legend=alt.Legend(orient="bottom", labelLimit=400)),
            tooltip=["config:N", "stat:N", alt.Tooltip("seconds:Q", format=".4f")]))
    return alt.hconcat(*panels).resolve_scale(y="independent")


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """ratio_frame as text for people: rows with no value anywhere dropped (goodput
    without an SLO), missing values and ratios of zero counts as NONE."""
    table = table[~table.map(_missing).all(axis=1)]
    out = table.copy().astype(object)
    for column in table.columns:
        show = _ratio if " / " in column else _value
        out[column] = [show(v) for v in table[column]]
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


NONE = "—"  # NOTE: not "-": st.table renders cells as Markdown, where "-" is a list item


def _ratio(value: Any) -> str:
    return NONE if _missing(value) else f"{value:.2f}x"


def _value(value: Any) -> str:
    if _missing(value):
        return NONE
    return f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else \
        f"{value:.0f}"


def show(result: dict[str, Any]) -> None:
    """Warnings first (they decide whether to trust the rest), then table, charts, notes."""
    window, cal = result["window"], result["calibration"]
    for warning in result["warnings"]:
        st.warning(f"**Warning:** {warning}", icon=":material/warning:")
    changes = [f"**{name}**: " + (", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in
                                           c["diff"].items()) or "no change")
               for name, c in result["configs"].items()]
    fit = cal["held_out"]
    st.markdown("  \n".join(changes))
    st.caption(f"{window['requests']} requests replayed (run {window['run_id']});"
               f" step-time fit error on held-out steps: median {_num(fit['median_abs_pct'])}%,"
               f" p90 {_num(fit['p90_abs_pct'])}% ({fit['steps']} steps)")
    # NOTE: a static table, not st.dataframe: every row is read side by side (no scrolling)
    table = display_frame(ratio_frame(result))
    st.table(table.style.set_properties(**{"text-align": "right"}))
    order = [_label(c) for c in result["columns"]]
    st.altair_chart(latency_charts(latency_frame(result), order), width="content")
    if result.get("capacity"):
        show_capacity(result["capacity"])
    for note in result["notes"]:
        st.caption(f"Note: {note}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
