"""`batchpilot whatif`: predict what a live config change would do, from the trace.

    batchpilot whatif --db trace.duckdb --since -1h --set max_num_seqs=64
    batchpilot whatif --url http://127.0.0.1:8000 --since 14:00 --until 14:30 \\
        --compare seqs4:max_num_seqs=4 --compare small_chunk:prefill_chunk_size=32 \\
        --slo-ttft 0.5 --plot whatif.png
    batchpilot whatif --db trace.duckdb --set max_num_seqs=64 --rate-scale 2
    batchpilot whatif --db trace.duckdb --set max_num_seqs=64 --rate-sweep 1,1.5,2,3 \\
        --plot capacity.png

KEY=VALUE as `batchpilot ctl set` takes them (dotted keys, JSON values); a --compare's
settings are comma-separated. --db reads a trace file (a stopped server's, or a copy with
its .wal) and predicts here; --url asks the running server (`POST /v1/whatif`), which
predicts in a process of its own. Exit codes: 0 done; 1 the server could not be reached
or failed; 2 a usage error, an invalid setting or an empty window.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from control.cli.ctl import TOKEN_ENV, build_patch
from control.cli.ctl_error import CtlError
from control.cli.http_json import HTTPFailure, request_json
from control.loadtest.records import SLO
from control.trace.format import as_json
from control.trace.timeparse import parse_time

HTTP_TIMEOUT_S = 600.0  # a long window's replays take a while
PROGRESS_FROM = 2000  # requests: show a progress bar (stderr) from this many
PROPOSED = "proposed"  # the name of --set's config
_SPLIT = re.compile(r",(?=[A-Za-z_][\w.]*=)")  # commas that start a KEY= (not in a value)


class WhatifError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def add_whatif_parser(sub: Any) -> None:
    p = sub.add_parser("whatif", help="predict a config change from the trace",
                       description="Replay a window of the trace under the recorded config"
                       " and proposed ones; print predicted latencies, goodput, rejections,"
                       " timeouts, KV and preemptions next to what was recorded"
                       " (docs/whatif.md).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--db", metavar="FILE", help="trace file (not held by a server)")
    src.add_argument("--url", metavar="URL", help="a running server with --trace-db")
    p.add_argument("--since", help="window start (epoch, ISO, 14:02, -15m); default: first")
    p.add_argument("--until", help="window end; default: the last request recorded")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help=f"one proposed config (named {PROPOSED!r})")
    p.add_argument("--compare", action="append", metavar="NAME:K=V,K=V",
                   help="a named proposed config (repeatable)")
    p.add_argument("--config", metavar="YAML",
                   help="with --db: the server's serving YAML, for what the trace does not"
                   " record (block_size, lanes, watermarks, timeouts)")
    for name in ("ttft", "tpot", "e2e"):
        p.add_argument(f"--slo-{name}", type=float, metavar="S",
                       help=f"{name.upper()} SLO (seconds) for goodput")
    p.add_argument("--rate-scale", type=float, default=1.0, metavar="K",
                   help="the proposals on the recorded arrivals at K times their rate (the"
                   " same requests, gaps divided by K), beside the recorded config at K")
    p.add_argument("--rate-sweep", metavar="K,K,...",
                   help="also every config at each of these rates: goodput and p99 against"
                   " rate, and each config's capacity (with --plot: goodput against rate)")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="the proposals (and --rate-sweep) on N replicas behind the fleet's"
                   " router, beside the recorded config on N")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --db: replay the configs in N processes side by side (each"
                   " replay is one core's work: worth it with idle cores only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the percentiles")
    p.add_argument("--token-env", default=TOKEN_ENV, metavar="NAME",
                   help=f"with --url: variable holding a read token (default {TOKEN_ENV})")
    p.set_defaults(func=run)


def proposals(set_: list[str] | None, compare: list[str] | None) -> dict[str, dict]:
    """--set / --compare arguments -> {name: merge patch}; WhatifError (2) when malformed."""
    out: dict[str, dict] = {}
    try:
        if set_:
            out[PROPOSED] = build_patch(set_)
        for text in compare or ():
            name, sep, settings = text.partition(":")
            if not sep or not name or not settings:
                raise WhatifError(f"--compare {text!r} is not NAME:KEY=VALUE[,KEY=VALUE...]"
                                  " (e.g. seqs64:max_num_seqs=64,prefill_chunk_size=512)", 2)
            if name in out:
                raise WhatifError(f"--compare {name!r} is named twice", 2)
            out[name] = build_patch(_SPLIT.split(settings))
    except CtlError as exc:
        raise WhatifError(str(exc), exc.code) from None
    if not out:
        raise WhatifError("nothing to predict: give --set KEY=VALUE ... or --compare"
                          " NAME:KEY=VALUE,...", 2)
    return out


def slo_of(args: argparse.Namespace) -> SLO | None:
    values = {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot, "e2e_s": args.slo_e2e}
    for key, value in values.items():
        if value is not None and value <= 0:
            raise WhatifError(f"--slo-{key[:-2]}={value} must be > 0 seconds", 2)
    return SLO(**values) if any(v is not None for v in values.values()) else None


def load_of(args: argparse.Namespace) -> dict[str, Any]:
    """--rate-scale, --rate-sweep and --replicas as predict takes them, checked;
    WhatifError (2) naming the flag."""
    from control.whatif.capacity import check_rate, check_replicas, parse_sweep

    try:
        out: dict[str, Any] = {"rate_scale": check_rate(args.rate_scale, "--rate-scale"),
                               "replicas": check_replicas(args.replicas, "--replicas")}
        if args.rate_sweep is not None:
            out["rate_sweep"] = parse_sweep(args.rate_sweep, "--rate-sweep")
    except ValueError as exc:
        raise WhatifError(str(exc), 2) from None
    return out


def _from_file(args: argparse.Namespace, props: dict, slo: SLO | None) -> dict:
    from control.trace.store import open_read_only
    from control.whatif.configs import base_config
    from control.whatif.run import predict
    from control.whatif.window import read_window

    try:
        since, until = parse_time(args.since), parse_time(args.until)
        con = open_read_only(args.db)
        try:
            window = read_window(con, since, until)
        finally:
            con.close()
        base, notes = base_config(window, args.config)
        return predict(window, base, props, slo=slo, notes=notes,
                       progress=len(window.requests) >= PROGRESS_FROM, workers=args.jobs,
                       **load_of(args))
    except (ValueError, FileNotFoundError) as exc:
        raise WhatifError(str(exc), 2) from None


def _from_url(args: argparse.Namespace, props: dict, slo: SLO | None) -> dict:
    if args.config:
        raise WhatifError("--config applies to --db only: the server knows its own config", 2)
    body: dict[str, Any] = {"since": args.since, "until": args.until, "compare": props}
    for key, value in load_of(args).items():
        if value not in (1, 1.0):  # the defaults are the server's too
            body[key] = list(value) if isinstance(value, tuple) else value
    if slo is not None:
        body["slo"] = {k: v for k, v in slo.__dict__.items() if v is not None}
    token = os.environ.get(args.token_env)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return request_json(args.url.rstrip("/"), "/v1/whatif", method="POST", body=body,
                            headers=headers, timeout_s=HTTP_TIMEOUT_S)
    except HTTPFailure as exc:
        if exc.status is None:
            raise WhatifError(exc.message, 1) from None
        raise WhatifError(f"the server answered {exc.status}: {exc.message}",
                          2 if 400 <= exc.status < 500 else 1) from None


def run(args: argparse.Namespace) -> int:
    from control.whatif.report import plot, text_report

    try:
        props = proposals(args.set, args.compare)
        slo = slo_of(args)
        if args.jobs < 1:
            raise WhatifError(f"--jobs={args.jobs} must be >= 1 (processes)", 2)
        result = _from_file(args, props, slo) if args.db else _from_url(args, props, slo)
    except WhatifError as exc:
        print(f"batchpilot whatif: error: {exc}", file=sys.stderr)
        return exc.code
    print(as_json(result) if args.json else text_report(result).rstrip("\n"))
    for warning in result["warnings"] if args.json else ():
        print(f"batchpilot whatif: WARNING: {warning}", file=sys.stderr)
    if args.plot:
        print(f"plot: {plot(result, args.plot)}", file=sys.stderr)
    return 0

