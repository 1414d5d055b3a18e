"""Canary: a fleet's canary rollout (`batchpilot ctl set K=V --canary N --watch 5m`) as it
runs, canary against baseline poll by poll with the rule's limits, and the last decision
with its evidence; above them, the fleet's config version on each replica. Reads the
ingress's /control/canary, /control/config and /control/history (docs/fleet.md); a single
server, or a trace file, has no canary to show."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from control.cli.ctl_error import CtlError
from dashboard import charts
from dashboard.context import context

REFRESH_S = 3  # while a canary runs, its section redraws this often
ROWS = (("requests", "Requests", None), ("ttft_p50_s", "TTFT p50", "s"),
        ("ttft_p99_s", "TTFT p99", "s"), ("tpot_p99_s", "TPOT p99", "s"),
        ("error_rate", "Errors + timeouts", "%"), ("goodput_share", "Goodput share", "%"),
        ("goodput_rps", "Goodput req/s per replica", None))
LIMITS = {"ttft_p99_s": "ttft_p99_s", "tpot_p99_s": "tpot_p99_s",
          "error_rate": "error_timeout_rate", "goodput_share": "goodput_share"}

ctx = context()
st.title("Canary")


NOT_A_FLEET = ("This server is not a fleet (or its control API is off): canaries run on"
               " a fleet's ingress — `batchpilot dashboard --url INGRESS`.")


def get(path: str) -> Any | None:
    try:
        return ctx.control.call("GET", path)
    except CtlError as exc:
        if "answered 404" in str(exc):
            st.info(NOT_A_FLEET)
        else:
            st.error(str(exc))
        return None


def fmt(value: Any, unit: str | None) -> str:
    if value is None:
        return "—"  # NOTE: not "-": st.table renders cells as Markdown (a bullet)
    if unit == "s":
        return f"{value * 1000:,.1f} ms"
    if unit == "%":
        return f"{value * 100:.1f}%"
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"


def side_by_side(canary: dict | None, baseline: dict | None,
                 checks: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows: the figures; columns: canary, baseline, the canary's limit, verdict."""
    by_metric = {c["metric"]: c for c in checks}
    rows = []
    for key, label, unit in ROWS:
        check = by_metric.get(LIMITS.get(key, ""), {})
        verdict = ("REGRESSED" if check.get("regressed") else "ok") if check else ""
        rows.append({"": label, "canary": fmt((canary or {}).get(key), unit),
                     "baseline": fmt((baseline or {}).get(key), unit),
                     "limit": fmt(check.get("limit"), unit), "verdict": verdict})
    return pd.DataFrame(rows).set_index("")


def versions_section() -> None:
    config = get("/control/config")
    if config is None:
        st.stop()
    if "converged" not in config:  # a single server's config: it has no replicas
        st.info(NOT_A_FLEET)
        st.stop()
    cols = st.columns(3)
    cols[0].metric("Fleet version", config["version"])
    cols[1].metric("Replicas", len(config["replicas"]))
    cols[2].metric("Converged", "yes" if config["converged"] else "no")
    st.table(pd.DataFrame([{"replica": f"replica {r['replica_id']}",
                            "runs version": fmt(r["fleet_version"], None),
                            "target": r["target_version"],
                            "healthy": "yes" if r["healthy"] else "no"}
                           for r in config["replicas"]]), hide_index=True)


def running_section(run: dict[str, Any]) -> None:
    last = run["polls"][-1] if run["polls"] else {}
    elapsed = time.time() - run["window_start"]
    st.subheader(f"{run['canary_id']}: watching")
    diff = ", ".join(f"{k} {a} → {b}" for k, (a, b) in run["diff"].items())
    st.write(f"Fleet version {run['version']} ({diff}) on replica(s)"
             f" {', '.join(map(str, run['canaries']))}; baseline"
             f" {', '.join(map(str, run['baseline']))} at version {run['base_version']}."
             f" Started by {run['actor']}: {run['reason'] or 'no reason given'}.")
    window = max(run["deadline"] - run["window_start"], 1e-9)
    st.progress(min(elapsed / window, 1.0),
                text=f"{elapsed:.0f} s of {window:.0f} s; last poll: "
                f"{last.get('why', 'none yet')}")
    st.table(side_by_side(last.get("canary"), last.get("baseline"), last.get("checks", [])))
    series = [{"time": p["time"], "side": side, "metric": metric,
               "value": (p[side] or {}).get(metric)}
              for p in run["polls"] for side in ("canary", "baseline")
              for metric in ("ttft_p99_s", "tpot_p99_s")]
    df = charts.frame([s for s in series if s["value"] is not None])
    left, right = st.columns(2)
    for column, metric, title in ((left, "ttft_p99_s", "TTFT p99 (s), each poll"),
                                  (right, "tpot_p99_s", "TPOT p99 (s), each poll")):
        with column:
            part = df[df["metric"] == metric] if not df.empty else df
            charts.show(charts.lines(part, "side", "value", title, "seconds",
                                     charts.changes_frame([]), fmt=".3f"),
                        "No finished requests in the window yet.")


def decision_section(event: dict[str, Any]) -> None:
    promoted = event["decision"] == "promoted"
    st.subheader(f"Last decision: {event['canary_id']} {event['decision']}")
    when = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    (st.success if promoted else st.error)(
        f"{event['why']}. Fleet version now {event['fleet_version']} (candidate"
        f" {event['version']}); decided at {when} after {event['window_s']:.0f} s of window.")
    st.table(side_by_side(event.get("canary"), event.get("baseline"), event.get("checks", [])))
    with st.expander("Thresholds of the rule (docs/fleet.md)"):
        st.json(event.get("thresholds", {}))


if not ctx.live or ctx.control is None:
    st.info("A trace file has no canary to show: open the fleet's ingress (`--url`).")
    st.stop()
versions_section()
canary = (get("/control/canary") or {}).get("canary")
history = get("/control/history") or {}
decided = [e for e in history.get("events", [])
           if e["kind"] in ("canary_promote", "canary_rollback")]


@st.fragment(run_every=REFRESH_S if canary and canary["status"] == "watching" else None)
def live_part() -> None:
    run = (get("/control/canary") or {}).get("canary")
    if run and run["status"] == "watching":
        running_section(run)
    elif run is None and not decided:
        st.info("No canary has run on this fleet yet: `batchpilot ctl set KEY=VALUE"
                " --canary 1 --watch 5m`.")


live_part()
if decided:
    decision_section(decided[-1])
