"""Control: the live budgets, watermarks and lanes in a form that calls the control API
(If-Match on the version shown, so a concurrent change is refused, not overwritten), with
Predict beside Apply (the form's change replayed over the trace's last window by the
server's POST /v1/whatif, side by side with what was recorded; nothing applied), profiles,
the history with diffs, rollback, and drain/resume. Validation messages are shown as the
API words them. Over a trace file: the recorded changes, read-only (the What-if page
predicts from a file)."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from control.cli.ctl_error import CtlError
from control.cli.ctl_format import slo_text as lane_slo_text
from dashboard import charts, whatif_panel
from dashboard.context import Ctx, ask, context, window
from dashboard.control_form import (
    BUDGETS,
    PREDICT_WINDOWS_S,
    WATERMARKS,
    clean,
    lane_rows,
    lanes_from_rows,
    merge_patch,
)
from engine.config.schema import BATCHING_MODES, SCHEDULE_POLICIES

ctx = context()
since, until = window(ctx)
st.title("Control")


def call(ctx: Ctx, method: str, path: str, body: Any = None, **kw: Any) -> Any | None:
    try:
        return ctx.control.call(method, path, body, **kw)
    except CtlError as exc:
        st.error(str(exc))
        return None


def show_result(data: dict[str, Any] | None, dry_run: bool) -> None:
    if data is None:
        return
    diff = data.get("diff", {})
    lines = [f"`{k}`: {old} → {new}" for k, (old, new) in diff.items()] or ["no change"]
    verdict = ("dry run: valid, nothing applied" if dry_run else
               f"applied: now version {data['version']}" if data.get("applied") else
               "nothing to apply")
    (st.info if dry_run else st.success)("  \n".join([verdict, *lines]))


def form_fields(config: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """The form's inputs, filled with `config`: (edited settings, the lanes table)."""
    cols = st.columns(3)
    edited: dict[str, Any] = {}
    for i, key in enumerate(BUDGETS):
        edited[key] = int(cols[i % 3].number_input(key, value=int(config[key]), step=1,
                                                   key=f"bp_{key}"))
    cols = st.columns(3)
    for i, key in enumerate(WATERMARKS):
        edited[key] = float(cols[i].number_input(key, value=float(config[key]),
                                                 min_value=0.0, max_value=1.0,
                                                 step=0.01, format="%.2f",
                                                 key=f"bp_{key}"))
    edited["chunked_prefill"] = cols[2].checkbox("chunked_prefill",
                                                 config["chunked_prefill"],
                                                 key="bp_chunked_prefill")
    cols = st.columns(2)
    edited["schedule_policy"] = cols[0].selectbox(
        "schedule_policy", SCHEDULE_POLICIES,
        SCHEDULE_POLICIES.index(config["schedule_policy"]), key="bp_schedule_policy")
    edited["batching"] = cols[1].selectbox(
        "batching", BATCHING_MODES, BATCHING_MODES.index(config["batching"]),
        key="bp_batching")
    default = config.get("default_slo")

    def slo(own: dict[str, Any] | None, fallback: dict[str, Any] | None = default) -> str:
        return lane_slo_text(own, fallback, ", ", "no targets")

    st.markdown("**Lanes**. SLO targets, the table's `slo_*` cells (seconds; empty: the"
                f" default SLO, {slo(default, None)}): "
                + "; ".join(f"{name}: {slo(lane.get('slo'))}"
                            for name, lane in config["lanes"].items()))
    table = pd.DataFrame.from_dict(lane_rows(config["lanes"]), orient="index")
    return edited, st.data_editor(table, key="bp_lanes", num_rows="fixed")


def edit_form(data: dict[str, Any]) -> None:
    config = data["config"]
    with st.form("bp_config_form"):
        st.markdown(f"**Version {data['version']}** · admission **{data['admission']}**")
        edited, rows = form_fields(config)
        left, right = st.columns([3, 1])
        reason = left.text_input("Reason (goes to the audit log)", key="bp_reason")
        span = right.selectbox("Predict over the last", list(PREDICT_WINDOWS_S), index=1,
                               key="bp_predict_window")
        a, b, c = st.columns(3)
        check = a.form_submit_button("Validate (dry run)", key="bp_validate")
        guess = b.form_submit_button("Predict", icon=":material/query_stats:",
                                     key="bp_predict")
        apply = c.form_submit_button("Apply", type="primary", key="bp_apply")
    if not (check or guess or apply):
        return
    edited["lanes"] = lanes_from_rows(
        {name: {f: clean(v) for f, v in row.items()} for name, row in
         rows.to_dict(orient="index").items()}, config["lanes"])
    patch = merge_patch(config, edited)
    if not patch:
        st.info("Nothing changed in the form." + (" Change a setting to predict what it"
                                                   " would do." if guess else ""))
    elif guess:
        predict_patch(patch, PREDICT_WINDOWS_S[span])
    else:
        result = call(ctx, "PATCH", "/control/config",
                      {"changes": patch, "reason": reason, "lane_moves": {}},
                      dry_run=check, if_match=data["version"])
        show_result(result, dry_run=check)


def predict_patch(patch: dict[str, Any], span_s: float) -> None:
    """The form's change replayed over the last `span_s` of the trace, next to what was
    recorded and the config as it is (the server predicts; nothing is applied)."""
    st.subheader("Prediction")
    st.caption(f"The requests of the last {span_s / 60:g} min replayed under the config as"
               " it is and with the form's change. Nothing was applied: read the ratios and"
               " warnings, then Apply. Ratios: as-is / recorded is the prediction's own"
               " error, proposed / as-is the change.")
    now = time.time()
    result = whatif_panel.predict(ctx, now - span_s, now, {"proposed": patch})
    if result is not None:
        whatif_panel.show(result)


def profiles_and_history(data: dict[str, Any]) -> None:
    left, right = st.columns(2)
    with left:
        st.subheader("Profiles")
        names = list(data.get("profiles") or {})
        if not names:
            st.caption("No profiles in the serving YAML.")
        else:
            name = st.selectbox("Profile", names, key="bp_profile")
            st.json(data["profiles"][name], expanded=False)
            if st.button(f"Apply profile {name}", key="bp_apply_profile"):
                show_result(call(ctx, "POST", f"/control/profiles/{name}",
                                 {"reason": "dashboard"}), dry_run=False)
    with right:
        st.subheader("Admission")
        st.caption("Drain stops new requests (503) and lets running ones finish.")
        a, b = st.columns(2)
        if a.button("Drain", key="bp_drain"):
            call(ctx, "POST", "/control/drain", {"reason": "dashboard"})
        if b.button("Resume", key="bp_resume"):
            call(ctx, "POST", "/control/resume", {"reason": "dashboard"})
    st.subheader("History")
    history = call(ctx, "GET", "/control/history") or {"versions": []}
    versions = history["versions"]
    table = pd.DataFrame([{**v, "diff": charts.diff_text(v.get("diff"))} for v in versions])
    if not table.empty:
        table["time"] = pd.to_datetime(table["time"], unit="s", utc=True)
        st.dataframe(table.iloc[::-1], hide_index=True)
        older = [v["version"] for v in versions if v["version"] != data["version"]]
        if older:
            target = st.selectbox("Roll back to version", older[::-1], key="bp_rollback_to")
            if st.button(f"Roll back to {target}", key="bp_rollback"):
                show_result(call(ctx, "POST", f"/control/rollback/{target}",
                                 {"reason": "dashboard rollback"}), dry_run=False)


if ctx.live:
    current = call(ctx, "GET", "/control/config")
    if current is None:
        st.stop()
    edit_form(current)
    profiles_and_history(current)
else:
    st.info("A trace file is read-only: these are the config changes it recorded. Open a"
            " running server (`batchpilot dashboard --url URL`) to change settings.")
changes = charts.changes_frame(ask(ctx, "config_changes", since=since, until=until))
st.subheader("Config changes (and what-if predictions) recorded in the trace")
if changes.empty:
    st.caption("None in this window.")
else:
    st.dataframe(changes[["time", "version", "source", "actor", "diff", "note"]],
                 hide_index=True)
