"""`batchpilot fleet autoscale`: an autoscaled fleet's state, and its settings changed live
(GET / PATCH /control/fleet/autoscale on its ingress).

    batchpilot fleet autoscale --url http://INGRESS            # phases, the rule, events
    batchpilot fleet autoscale --url ... --set downscale_delay_s=60 --reason "night"

Exit codes: 0 shown or changed; 1 the ingress could not be reached; 2 a bad setting or a
fleet that is not autoscaled (the ingress's message says which); 3 the token is missing,
wrong, or (for --set) read-only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from control.cli.ctl import Client
from control.cli.ctl_error import CtlError
from control.fleet.autoscale import parse_settings
from control.fleet.restart_cli import add_ingress_args

PATH = "/control/fleet/autoscale"
EVENTS_SHOWN = 10


def add_autoscale_parser(fleet_sub: Any) -> None:
    parser = fleet_sub.add_parser(
        "autoscale", help="an autoscaled fleet's phases and scale events; change its rule",
        description="Show each replica slot's phase, what the autoscaling rule wants and"
        " why, and the last scale events; with --set, change thresholds and delays live"
        " (admin token). docs/fleet.md, Autoscaling.")
    add_ingress_args(parser)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        dest="changes", help="a setting to change (repeat for more)")
    parser.add_argument("--reason", default="", help="recorded in the fleet's audit events")
    parser.set_defaults(func=run_autoscale)


def run_autoscale(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    try:
        client = Client(args.url, args.token_env)
        if args.changes:
            try:
                changes = parse_settings(args.changes, "--set")
            except ValueError as exc:
                raise CtlError(str(exc), 2) from None
            done = client.call("PATCH", PATH, {"changes": changes, "reason": args.reason})
            diff = ", ".join(f"{k} {old:g} -> {new:g}" for k, (old, new) in
                             done["diff"].items())
            out(f"changed: {diff}" if diff else "nothing changed: each setting had that value")
        show(client.call("GET", PATH), out)
        return 0
    except CtlError as exc:
        print(f"batchpilot fleet autoscale: error: {exc}", file=sys.stderr)
        return exc.code


def show(state: dict[str, Any], out: Callable[[str], None]) -> None:
    if not state["enabled"]:
        out("this fleet is not autoscaled: every replica always runs")
        return
    cfg, want = state["config"], state["wanted"]
    out(f"size {cfg['min_replicas']}-{cfg['max_replicas']}; the rule wants"
        f" {want['replicas'] if want else '-'} ({want['reason'] if want else 'no signals yet'})"
        + (f"; held by the {state['hold']}" if state.get("hold") else "")
        + (f"; under way: {state['in_flight']}" if state.get("in_flight") else ""))
    out("  ".join(f"replica {s['replica_id']}: {s['phase']}"
                  + (" (fixed)" if s["fixed"] else "") for s in state["slots"]))
    out("up: " + ", ".join(f"{k}={cfg[k]:g}" for k in ("up_waiting", "up_queue_share",
                                                       "up_kv_usage", "upscale_delay_s"))
        + "; down: " + ", ".join(f"{k}={cfg[k]:g}" for k in ("down_running", "down_kv_usage",
                                                            "downscale_delay_s")))
    for e in state["events"][-EVENTS_SHOWN:]:
        held = f", wanted for {e['waited_s']:.1f} s" if e.get("waited_s") is not None else ""
        out(f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))} replica"
            f" {e['replica_id']}: {e['event']} ({e['from']} -> {e['to']}; {e['reason']}{held})"
            f"; {e['routed_replicas']} routed")
