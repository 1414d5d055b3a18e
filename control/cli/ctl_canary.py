"""`batchpilot ctl set K=V --canary N --watch 5m` and `batchpilot ctl canary`: start a
canary on a fleet's ingress (POST /control/canary) and follow it (GET /control/canary),
a line per poll, then the decision with its evidence. The canary runs in the ingress: if
this command stops, it goes on and decides by itself (`ctl canary --follow` picks it up).

Exit codes add 4: the canary rolled the change back (a regression, or inconclusive).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any

from control.cli.ctl_error import CtlError

ROLLED_BACK_EXIT = 4
FOLLOW_EVERY_S = 1.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'5m' -> 300.0, '30s', '1.5h', '90' (seconds); else ValueError naming the flag."""
    match = _DURATION.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"--watch={text!r} must be a positive duration like 30s, 5m or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def side_text(name: str, side: dict[str, Any] | None) -> str:
    if not side:
        return f"{name}: -"
    ids = ",".join(map(str, side.get("replicas", [])))
    return (f"{name} [{ids}] {side['requests']} req, TTFT p99 {_ms(side['ttft_p99_s'])},"
            f" TPOT p99 {_ms(side['tpot_p99_s'])}, err+timeout {_pct(side['error_rate'])},"
            f" goodput {_pct(side['goodput_share'])}")


def poll_line(run: dict[str, Any], poll: dict[str, Any]) -> str:
    canary, baseline = side_text("canary", poll["canary"]), side_text("baseline",
                                                                    poll["baseline"])
    window = run["watch_s"] * (1 + run.get("extensions", 0))  # each extension adds watch_s
    return (f"{poll['elapsed_s']:6.1f}s/{window:.0f}s  {canary}  |  {baseline}"
            f"  -> {poll['decision']}")


def decision_text(run: dict[str, Any]) -> str:
    d = run.get("decision") or {}
    lines = [f"{run['canary_id']}: {run['status']} ({d.get('why', '-')})",
             f"  {side_text('canary', d.get('canary'))}",
             f"  {side_text('baseline', d.get('baseline'))}"]
    for check in d.get("checks", []):
        mark = "REGRESSED" if check["regressed"] else "ok"
        lines.append(f"  {check['metric']:<20} canary {_num(check['canary'])}  baseline"
                     f" {_num(check['baseline'])}  limit {_num(check['limit'])}  {mark}")
    lines.append(f"  fleet version now {d.get('fleet_version', '-')}"
                 f" (candidate {run['version']})")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def follow(get: Callable[[], dict[str, Any] | None], out: Any = None,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Print each new poll of the running canary until it decides; -> the final run."""
    out = out or sys.stdout  # looked up now: a caller may have replaced it
    seen = 0.0
    while True:
        run = get()
        if run is None:
            raise LookupError("this fleet has run no canary")
        for poll in run.get("polls", []):
            if poll["time"] > seen:
                print(poll_line(run, poll), file=out, flush=True)
                seen = poll["time"]
        if run["status"] != "watching":
            print(decision_text(run), file=out, flush=True)
            return run
        sleep(FOLLOW_EVERY_S)


def exit_for(run: dict[str, Any]) -> int:
    return 0 if run["status"] == "promoted" else ROLLED_BACK_EXIT


def start_text(run: dict[str, Any]) -> str:
    diff = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in run["diff"].items())
    return (f"{run['canary_id']}: fleet version {run['version']} ({diff}) on replica(s)"
            f" {', '.join(map(str, run['canaries']))}; baseline"
            f" {', '.join(map(str, run['baseline']))} at version {run['base_version']};"
            f" watching {run['watch_s']:.0f}s, a poll every {run['poll_s']:.0f}s")


# ---- the commands (control/cli/ctl.py dispatches) --------------------------------------
def start_command(args: Any, client: Any, body: dict[str, Any],
                  version: int) -> Any:
    """POST /control/canary on a fleet's ingress, then follow it (unless --detach)."""
    if args.dry_run:
        raise CtlError("--dry-run and --canary: a dry run applies nothing to watch", 2)
    try:
        watch_s = parse_duration(args.watch or "5m")
    except ValueError as exc:
        raise CtlError(str(exc), 2) from None
    body = {**body, "replicas": args.canary, "watch_s": watch_s}
    if args.min_requests is not None:
        body["min_requests"] = args.min_requests
    try:
        run = client.call("POST", "/control/canary", body, if_match=version)
    except CtlError as exc:
        if "answered 404" in str(exc) and "control API is off" not in str(exc):
            raise CtlError(f"--canary needs a fleet's ingress (`batchpilot fleet`): {exc}",
                           2) from None
        raise
    if args.detach or args.json:
        return run, start_text
    print(start_text(run), flush=True)
    return follow_command(client)


def follow_command(client: Any) -> Any:
    try:
        final = follow(lambda: client.call("GET", "/control/canary")["canary"])
    except LookupError as exc:
        raise CtlError(str(exc), 1) from None
    except KeyboardInterrupt:
        raise CtlError("stopped following; the canary goes on in the ingress and decides by"
                       " itself (`batchpilot ctl canary --follow` picks it up)", 130) from None
    return final, lambda _: "", exit_for(final)


def canary_command(args: Any, client: Any) -> Any:
    """The fleet's running or last canary; --follow: until it decides."""
    if args.follow and not args.json:
        return follow_command(client)
    run = client.call("GET", "/control/canary")["canary"]
    if run is None:
        return None, lambda _: "this fleet has run no canary"
    return run, lambda r: decision_text(r) if r["status"] != "watching" else \
        start_text(r) + "\n" + "\n".join(
            poll_line(r, p) for p in r["polls"][-5:])
