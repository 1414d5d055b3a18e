"""`batchpilot fleet restart`: a rolling restart of a running fleet, one replica at a time
(POST /control/fleet/restart on its ingress), followed to the end (GET, a line per phase per
replica with its timings). The restart runs in the ingress: if this command stops, it goes
on (`batchpilot fleet restart --follow` picks it up).

Exit codes: 0 every replica restarted and no request was aborted; 1 the ingress could not be
reached, or a replica did not come back in time (the restart stopped there); 2 the ingress
refused (another restart or a canary is running, bad value); 3 the token is missing, wrong
or read-only; 4 every replica restarted but requests still running at the end of a grace
period were aborted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from control.cli.ctl import DEFAULT_URL, TOKEN_ENV, URL_ENV, Client
from control.cli.ctl_error import CtlError

PATH = "/control/fleet/restart"
FOLLOW_EVERY_S = 0.25
ABORTED_EXIT = 4


def add_ingress_args(parser: argparse.ArgumentParser) -> None:
    """--url and --token-env: how a `batchpilot fleet` command reaches the ingress."""
    import os

    parser.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL),
                        help=f"the fleet's ingress (default ${URL_ENV}, else %(default)s)")
    parser.add_argument("--token-env", metavar="NAME", default=TOKEN_ENV,
                        help="environment variable holding the token (default %(default)s)")


def add_restart_parser(fleet_sub: Any) -> None:
    parser = fleet_sub.add_parser(
        "restart", help="restart every replica, one at a time, dropping no request",
        description="A rolling restart: each replica in turn is taken out of routing, its"
        " requests finish (up to --grace), Ray Serve replaces its process, and it is routed"
        " to again once the new process is ready and runs the fleet's config version"
        " (docs/fleet.md). Needs an admin token when the fleet has tokens.")
    add_ingress_args(parser)
    parser.add_argument("--grace", type=float, default=30.0, metavar="S",
                        help="seconds a replica's requests in flight may run before the rest"
                        " are aborted (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds a replica may take to come back (default %(default)s)")
    parser.add_argument("--replicas", metavar="IDS",
                        help="comma-separated replica ids, in order (default: all)")
    parser.add_argument("--reason", default="", help="recorded in the fleet's audit events")
    parser.add_argument("--follow", action="store_true",
                        help="follow the running (or last) restart instead of starting one")
    parser.set_defaults(func=run_restart)


def run_restart(args: argparse.Namespace, out: Callable[[str], None] = print,
                sleep: Callable[[float], None] = time.sleep) -> int:
    try:
        client = Client(args.url, args.token_env)
        if args.follow:
            run = client.call("GET", PATH)["restart"]
            if run is None:
                raise CtlError("no rolling restart has run on this fleet", 1)
        else:
            run = client.call("POST", PATH, _body(args))["restart"]
        out(f"{run['restart_id']}: replicas {[s['replica_id'] for s in run['steps']]} one at"
            f" a time, grace {run['grace_s']:g} s")
        return follow(client, run, out, sleep)
    except CtlError as exc:
        print(f"batchpilot fleet restart: error: {exc}", file=sys.stderr)
        return exc.code


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"grace_s": args.grace, "ready_timeout_s": args.timeout,
                            "reason": args.reason}
    if args.replicas:
        try:
            body["replicas"] = [int(x) for x in args.replicas.split(",")]
        except ValueError:
            raise CtlError(f"--replicas={args.replicas!r} must be comma-separated ids like"
                           " 0,1", 2) from None
    return body


def follow(client: Client, run: dict[str, Any], out: Callable[[str], None],
           sleep: Callable[[float], None]) -> int:
    """Print each new phase of each replica until the restart ends; -> the exit code."""
    shown = 0
    while True:
        for event in run["events"][shown:]:
            elapsed = event["time"] - run["started"]
            out(f"[{elapsed:7.2f} s] replica {event['replica_id']}: {event['phase']}:"
                f" {event['message']}")
        shown = len(run["events"])
        if run["status"] != "running":
            break
        sleep(FOLLOW_EVERY_S)
        run = client.call("GET", PATH)["restart"]
    took = (run["finished"] or time.time()) - run["started"]
    if run["status"] == "failed":
        out(f"{run['restart_id']} FAILED after {took:.1f} s: {run['error']};"
            f" {run['aborted']} request(s) aborted")
        return 1
    out(f"{run['restart_id']} done: {len(run['steps'])} replica(s) restarted in {took:.1f} s;"
        f" {run['aborted']} request(s) aborted")
    return ABORTED_EXIT if run["aborted"] else 0
