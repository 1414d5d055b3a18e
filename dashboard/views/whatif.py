"""What-if: several named configs predicted over the sidebar's window, side by side with
what the trace recorded: a table with ratios, p50/p99 of TTFT, TPOT and E2E per config,
and every warning (extrapolation, few steps, a loose fit); with a rate scale, the rows at
that multiple of the recorded arrival rate, and with a capacity sweep, goodput and p99 TTFT
against rate and each config's capacity. Live, the server predicts
(POST /v1/whatif, recorded in its audit); over a trace file, this process replays it.
Nothing is applied: the Control page (or `batchpilot ctl set`) does that."""

from __future__ import annotations

from typing import Any

import streamlit as st

from control.cli.ctl_error import CtlError
from control.loadtest.records import SLO
from control.whatif.cli import WhatifError
from dashboard import whatif_panel
from dashboard.capacity_panel import parse_rates
from dashboard.context import Ctx, context, window

ctx = context()
since, until = window(ctx)
st.title("What-if")
st.caption("Each row is a config: settings as `batchpilot ctl set` takes them, comma-separated"
           " (`max_num_seqs=64, prefill_chunk_size=256`, `lanes.batch.weight=2`). The"
           " requests of the sidebar's window are replayed under the recorded config"
           " (**predicted as-is**: its distance from **recorded** is the prediction's own"
           " error) and under each row; `NAME / as-is` is the change a row makes. A rate"
           " scale replays the rows on the same requests arriving that many times as fast"
           " (beside **as-is@Kx**, the recorded config at that rate), replicas on that many"
           " replicas behind the fleet's router; a capacity sweep replays every config at"
           " each rate. Nothing is applied.")


def current_config(ctx: Ctx) -> dict[str, Any] | None:
    if not ctx.live or ctx.control is None:
        return None
    try:
        return ctx.control.call("GET", "/control/config")["config"]
    except CtlError:
        return None  # the prediction's own call says what is wrong


def slo_inputs() -> SLO | None:
    st.markdown("SLOs for goodput (seconds; 0 = each lane's own, as recorded)")
    cols = st.columns(3)
    values = {key: cols[i].number_input(key, min_value=0.0, value=0.0, step=0.05,
                                        format="%.3f", key=f"bp_whatif_{key}")
              for i, key in enumerate(("ttft_s", "tpot_s", "e2e_s"))}
    chosen = {k: float(v) for k, v in values.items() if v > 0}
    return SLO(**chosen) if chosen else None


with st.form("bp_whatif_form"):
    rows = st.data_editor(whatif_panel.default_rows(current_config(ctx)), num_rows="dynamic",
                          hide_index=True, key="bp_whatif_configs", width="stretch",
                          column_config={"name": st.column_config.TextColumn(width="small"),
                                         "settings": st.column_config.TextColumn(
                                             width="large")})
    slo = slo_inputs()
    scale_col, replicas_col, sweep_col = st.columns([1, 1, 2])
    rate_scale = scale_col.number_input(
        "rate scale (x the recorded arrival rate)", min_value=0.1, max_value=100.0,
        value=1.0, step=0.5, key="bp_whatif_rate_scale")
    replicas = replicas_col.number_input(
        "replicas (behind the fleet's router)", min_value=1, max_value=64, value=1, step=1,
        key="bp_whatif_replicas")
    rate_sweep = sweep_col.text_input(
        "capacity sweep: rate scales, e.g. 0.5, 1, 2, 4 (empty: none)",
        key="bp_whatif_rate_sweep")
    compare = st.form_submit_button("Compare", type="primary", icon=":material/query_stats:",
                                    key="bp_whatif_compare")

if compare:
    try:
        configs = whatif_panel.parse_rows(rows.to_dict(orient="records"))
        rates = parse_rates(float(rate_scale), rate_sweep, int(replicas))
    except WhatifError as exc:
        st.error(f"Invalid: {exc}")
        st.stop()
    result = whatif_panel.predict(ctx, since, until, configs, slo, rates)
    if result is not None:
        whatif_panel.show(result)
else:
    st.info("Set the configs to compare and press **Compare**: the replay takes a few"
            " seconds per config for an hour of traffic.")
