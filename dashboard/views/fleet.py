"""Fleet: a fleet's replicas as its ingress sees them right now (healthy, routable, config
version, queue, KV usage, the blocks its KV index says each holds) and the routing
decisions by reason and replica. Reads the ingress's /readyz, the probe every load
balancer already polls (docs/fleet.md); a single server, or a trace file, has no fleet.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from control.cli.http_json import HTTPFailure, request_json
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
    rows = []
    for r in ready["replicas"]:
        held = index.get(r["replica_id"])
        rows.append({
            "replica": r["replica_id"],
            "state": ("down" if not r.get("healthy") else
                      "out of routing" if not r.get("routable", True) else "serving"),
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
serving = sum(1 for r in replicas if r.get("healthy") and r.get("routable", True))
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
if st.button("Refresh", icon=":material/refresh:"):
    st.rerun()
