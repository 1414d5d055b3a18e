"""Text output of `batchpilot ctl`: the live config, lanes, a change's diff, the history."""

from __future__ import annotations

import json
from typing import Any

from control.trace.format import clock, table
from engine.config.slo import LaneSLO

LANE_COLUMNS = ("weight", "max_running", "max_waiting", "policy", "tenant_fair_share",
                "queue_timeout_ms", "preempt_first", "preempt_to_start", "batching")


def show(value: Any) -> str:
    """A value for a terminal: strings bare, the rest as JSON (null, true, 0.9, {...})."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def lanes_text(config: dict[str, Any], state: dict[str, Any], indent: str = "  ") -> list[str]:
    rows = [[name, *("-" if lane.get(c) is None else show(lane[c]) for c in LANE_COLUMNS),
             slo_text(lane.get("slo"), config.get("default_slo")),
             state.get(name, {}).get("running", "-"), state.get(name, {}).get("waiting", "-")]
            for name, lane in config.get("lanes", {}).items()]
    headers = ["lane", ">weight", ">max_running", ">max_waiting", "policy", "fair_share",
               ">timeout_ms", "preempt", "preempt_to_start", "batching", "slo", ">running",
               ">waiting"]
    return table(headers, rows, indent)


def slo_text(own: dict[str, Any] | None, default: dict[str, Any] | None, sep: str = "/",
             none: str = "none") -> str:
    """A lane's SLO as it counts: its own, else default_slo's (marked so)."""
    if own is not None:
        return LaneSLO.parse(own, "slo").describe(sep, none)
    inherited = LaneSLO.parse(default, "default_slo")
    return f"{inherited.describe(sep)} (default)" if inherited.is_set else none


def get_text(data: dict[str, Any]) -> str:
    config = data["config"]
    lines = [f"version {data['version']}   admission {data.get('admission', '-')}"]
    if "converged" in data:  # a fleet's ingress: each replica's version until they agree
        lines.append(fleet_text(data))
    lines.append("settings")
    lines += table(["key", "value"], [[k, show(v)] for k, v in config.items()
                                      if k not in ("lanes", "tenant_lanes")])[1:]
    tenants = config.get("tenant_lanes") or {}
    lines.append("tenant_lanes  " + (", ".join(f"{t} -> {lane}" for t, lane in tenants.items())
                                     or "-"))
    lines += ["lanes", *lanes_text(config, data.get("lanes_state", {}))]
    static = data.get("static", {})
    lines.append("static (restart to change)  " + "  ".join(f"{k}={show(v)}"
                                                            for k, v in static.items()))
    lines.append("profiles  " + (", ".join(data.get("profiles", {})) or "-"))
    return "\n".join(lines)


def _replica_text(r: dict[str, Any]) -> str:
    """`1:v3`, `1:v2->v3` (converging), `1:v3(down)`, or `1:off` (autoscaling's slot off)."""
    if not r.get("live", True):
        return f"{r['replica_id']}:off"
    target = "" if r["fleet_version"] == r["target_version"] else f"->v{r['target_version']}"
    down = "" if r["healthy"] else "(down)"
    return f"{r['replica_id']}:v{r['fleet_version']}{target}{down}"


def fleet_text(data: dict[str, Any]) -> str:
    replicas = "  ".join(_replica_text(r) for r in data.get("replicas", []))
    canary = data.get("canary")
    running = f"   canary {canary['canary_id']} {canary['status']}" if canary else ""
    return (f"fleet {'converged' if data['converged'] else 'converging'}   replicas"
            f" {replicas}{running}")


def change_text(data: dict[str, Any], dry_run: bool, before: int | None = None) -> str:
    """The diff as `key: old -> new` lines, then what became of it."""
    lines = [f"{key}: {show(old)} -> {show(new)}" for key, (old, new) in
             data.get("diff", {}).items()] or ["no setting changed"]
    if dry_run:
        lines.append(f"dry run: nothing was applied (still version {data['version']})")
    elif not data.get("applied"):
        lines.append(f"nothing to apply (still version {data['version']})")
    else:
        was = f" (was {before})" if before is not None else ""
        lines.append(f"applied: now version {data['version']}{was}")
        if "converged" in data:  # a fleet: every replica took it between two steps
            state = (f"every replica took it in {data['converge_s'] * 1000:.0f} ms"
                     if data["converged"] else "not every replica took it yet (the fleet"
                     " retries; `ctl get` shows each one)")
            lines.append(f"fleet: {state}")
    return "\n".join(lines)


def diff_summary(diff: dict[str, Any], most: int = 3) -> str:
    items = [f"{key} {show(old)}->{show(new)}" for key, (old, new) in diff.items()]
    more = f", +{len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more or "-"


def history_text(data: dict[str, Any]) -> str:
    rows = [[v["version"], clock(v.get("time"), date=True)[:19], v.get("actor") or "-",
             v.get("source") or "-", v.get("reason") or "-", diff_summary(v.get("diff", {}))]
            for v in data.get("versions", [])]
    lines = table([">version", "time", "actor", "source", "reason", "changes"], rows,
                  indent="")
    for event in data.get("events", []):  # a fleet's canaries: starts and verdicts
        lines.append(f"{clock(event.get('time'), date=True)[:19]}  {event['kind']}"
                     f"  {event.get('canary_id', '')}  {event.get('why', '')}")
    return "\n".join(lines)


# ---- subcommands -----------------------------------------------------------------------
