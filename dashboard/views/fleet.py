"""Fleet: a fleet's replicas as its ingress sees them right now (healthy, routable, config
version, queue, KV usage, the blocks its KV index says each holds), the routing decisions
by reason and replica, and, for an autoscaled fleet, each slot's phase, what the rule wants
and why, and the scale events. Reads the ingress's /readyz, the probe every load
balancer already polls (docs/fleet.md); a single server, or a trace file, has no fleet.
"""

from __future__ import annotations

import time
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from control.cli.http_json import HTTPFailure, request_json
from dashboard import charts
from dashboard.context import context

ctx = context()
st.title("Fleet")

NOT_A_FLEET = (f"The {ctx.label} is not a fleet: the replicas and routing of `batchpilot"
               " fleet` show here when the dashboard reads its ingress — `batchpilot"
               " dashboard --url INGRESS`.")


def readiness(url: str) -> dict[str, Any] | None:
    """The ingress's /readyz (its 503 while no replica is ready carries the same body)."""
    try:
        return request_json(url.rstrip("/"), "/readyz", timeout_s=5.0)
    except HTTPFailure as exc:
        if exc.status == 503 and exc.body.get("replicas") is not None:
            return exc.body
        st.error(f"GET /readyz: {exc.message}")
        return None


def replica_rows(ready: dict[str, Any]) -> pd.DataFrame:
    index = {row["replica_id"]: row for row in ready.get("kv_index") or ()}
    phases = {s["replica_id"]: s["phase"] for s in (ready.get("autoscale") or {}).get(
        "slots", ())}
    rows = []
    for r in ready["replicas"]:
        held = index.get(r["replica_id"])
        phase = phases.get(r["replica_id"], "on")
        rows.append({
            "replica": r["replica_id"],
            "state": (SCALED_STATE[phase] if phase != "on" else
                      "down" if not r.get("healthy") else
                      "out of routing" if not r.get("routable", True) else
                      "syncing config (not routed)" if r.get("runs_config") is False else
                      "serving"),
            "config version": r.get("fleet_version"),
            "waiting": r.get("waiting"), "running": r.get("running"),
            "in flight": r.get("ingress_inflight"),
            "KV usage": f"{100 * r['kv_usage']:.0f}%" if "kv_usage" in r else None,
            "KV blocks used": r.get("kv_blocks_used"),
            "cached blocks (index)": held["blocks"] if held else None,
            "index reads": (f"snapshots {held['snapshots']}, event batches {held['batches']}"
                            if held else None),
            "events dropped": held["dropped"] if held else None,
            "failed calls": r.get("failures"), "pid": r.get("pid")})
    # NOTE: "—", not None: a fleet without its control API has no config version
    return pd.DataFrame(rows).set_index("replica").astype(object).where(
        lambda df: df.notna(), "—")


def decisions_chart(decisions: dict[str, int]) -> alt.Chart:
    df = pd.DataFrame([{"reason": k, "requests": v} for k, v in decisions.items() if v])
    # NOTE: a band per reason (alt.Step): a fixed pixel height drew zero-height bars
    return alt.Chart(df, title="Routing decisions since the ingress started").mark_bar(
    ).encode(x=alt.X("requests:Q", title="requests",
                     axis=alt.Axis(format="d", tickMinStep=1)),
             y=alt.Y("reason:N", title=None, sort="-x"),
             color=alt.Color("reason:N", legend=None),
             tooltip=["reason:N", "requests:Q"]).properties(height=alt.Step(32))


SCALED_STATE = {"off": "scaled in (no replica)", "starting": "starting (scale-up)",
                "retiring": "draining (scale-down)"}


def scale_events_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([{
        "time": pd.Timestamp(e["time"], unit="s").strftime("%H:%M:%S"),
        "event": e["event"].replace("_", " "), "replica": e["replica_id"],
        "phase": f"{e['from']} → {e['to']}", "reason": e["reason"],
        "replicas routed after": e["routed_replicas"]} for e in reversed(events)])


def routed_chart(events: list[dict[str, Any]], now: float) -> alt.Chart:
    """Replicas routed to over time, a step at each scale event (until now)."""
    points = [{"time": pd.Timestamp(e["time"], unit="s"), "replicas": e["routed_replicas"]}
              for e in events]
    points.append({"time": pd.Timestamp(now, unit="s"), "replicas": points[-1]["replicas"]})
    return alt.Chart(pd.DataFrame(points), title="Replicas routed to").mark_line(
        interpolate="step-after", point=True).encode(
        x=charts.time_x(),
        y=alt.Y("replicas:Q", title="replicas", axis=alt.Axis(format="d", tickMinStep=1)),
        tooltip=["time:T", "replicas:Q"]).properties(height=180)


def autoscale_section(scale: dict[str, Any]) -> None:
    st.subheader("Autoscaling")
    cfg, want = scale["config"], scale.get("wanted")
    slots = scale["slots"]
    cols = st.columns(3)
    cols[0].metric("Size", f"{cfg['min_replicas']}–{cfg['max_replicas']}")
    cols[1].metric("Replicas running", sum(s["phase"] != "off" for s in slots))
    cols[2].metric("Rule wants", "—" if want is None else
                   f"{want['replicas']} ({want['reason'].replace('_', ' ')})")
    if scale.get("in_flight"):
        st.warning(f"Under way: {scale['in_flight']}. A canary or a rolling restart is"
                   " refused (409) until it settles.", icon=":material/sync:")
    if scale.get("hold"):
        st.info(f"Held by the {scale['hold']}: no replica starts or stops until it ends"
                " (one draining finishes).", icon=":material/pause:")
    st.caption(f"Up: {cfg['up_waiting']:g} waiting a replica, a queue wait at"
               f" {cfg['up_queue_share']:.0%} of its lane's TTFT target, or KV at"
               f" {cfg['up_kv_usage']:.0%}, held {cfg['upscale_delay_s']:g} s. Down: nothing"
               f" waiting, at most {cfg['down_running']:g} running a replica and KV under"
               f" {cfg['down_kv_usage']:.0%}, held {cfg['downscale_delay_s']:g} s; a replica"
               " drains (no new requests, the running ones end) before Ray Serve stops it.")
    events = scale["events"]
    if not events:
        st.info("No scale event yet: the fleet has kept its size.")
        return
    st.altair_chart(routed_chart(events, time.time()), width="stretch")
    st.dataframe(scale_events_frame(events), width="stretch", hide_index=True)


if not ctx.live:
    st.info(NOT_A_FLEET)
    st.stop()
ready = readiness(ctx.source.url)
if ready is None:
    st.stop()
if "replicas" not in ready or "routing" not in ready:  # one server's /readyz
    st.info(NOT_A_FLEET)
    st.stop()

replicas = ready["replicas"]
serving = sum(1 for r in replicas if r.get("healthy") and r.get("routable", True)
              and r.get("runs_config") is not False)
cols = st.columns(4)
cols[0].metric("Replicas serving", f"{serving} of {len(replicas)}")
cols[1].metric("Routing", ready["routing"])
cols[2].metric("Requests routed", f"{sum(ready['decisions'].values()):,}")
cols[3].metric("Ingress", "draining" if ready.get("draining") else "open")
st.dataframe(replica_rows(ready), width="stretch")
if ready["routing"] == "precise":
    st.caption("Cached blocks: the prefix-cache blocks the ingress's KV index says the"
               " replica holds, from its KV events; a snapshot is read at start, after a"
               " restart and when the ingress fell behind.")
if any(ready["decisions"].values()):
    st.altair_chart(decisions_chart(ready["decisions"]), width="stretch")
    st.caption("precise: the replica held the most of the prompt's blocks; affinity: the"
               " prefix's hashed replica; balance: the preferred one was too loaded, two"
               " chosen at random and the less loaded taken; only: one replica serving.")
else:
    st.info("No request has been routed yet.")
if ready.get("autoscale"):
    autoscale_section(ready["autoscale"])
if st.button("Refresh", icon=":material/refresh:"):
    st.rerun()
