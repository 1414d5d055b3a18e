"""`batchpilot dashboard`: the Streamlit operator dashboard (dashboard/app.py) over a
running server (--url: read and control APIs) or a trace file (--trace-db: postmortem).

    batchpilot dashboard --url http://127.0.0.1:8000 --port 8501
    batchpilot dashboard --trace-db incident.duckdb
    batchpilot dashboard --trace-db 'traces/replica-*.duckdb' --replica 1   # a fleet's files

Runs `python -m streamlit run dashboard/app.py` bound to --host (127.0.0.1 by default),
headless, without usage statistics or Streamlit's developer toolbar; it stops with Ctrl+C.

The dashboard has no login of its own: whoever opens its page acts with the operator's
token (--url) or reads every tenant's requests (--trace-db). So it binds loopback only
(LOOPBACK_HOSTS, as the server's rule for an open control API), unless
--allow-public-dashboard says an authenticating proxy is in front.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from control.cli.ctl import TOKEN_ENV, URL_ENV
from control.serve.settings import LOOPBACK_HOSTS

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def streamlit_command(args: argparse.Namespace) -> list[str]:
    source = ["--url", args.url] if args.url else ["--trace-db", os.path.abspath(args.trace_db)]
    if getattr(args, "replica", None) is not None:
        source += ["--replica", args.replica]
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", args.host, "--server.port", str(args.port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            # NOTE: "minimal" hides Streamlit's developer chrome (Deploy, Rerun, the menu)
            # that "auto" shows on localhost; an operator has no use for it
            "--client.toolbarMode", "minimal",
            "--", *source, "--token-env", args.token_env]


def public_host_refusal(host: str, allow_public: bool, flag: str = "--host") -> str | None:
    """Why the dashboard may not bind `host`, or None when it may (loopback, or allowed)."""
    if allow_public or host in LOOPBACK_HOSTS:
        return None
    return (f"{flag} {host} is not a loopback address, and the dashboard has no login of"
            " its own: whoever opens the page acts with the operator's token (with --url;"
            " its Control page changes the config) or reads every tenant's requests (with"
            " --trace-db). Keep it on 127.0.0.1 and put an authenticating proxy in front;"
            " pass --allow-public-dashboard only when such a proxy is there")


def _dashboard(args: argparse.Namespace) -> int:
    if args.trace_db:
        from control.trace.fleet_db import expand, is_pattern

        try:  # a glob (a fleet's files) must name files, and the replica one of them
            if is_pattern(args.trace_db) or args.replica is not None:
                expand(args.trace_db, args.replica)
            elif not os.path.isfile(args.trace_db):
                raise ValueError(f"trace DB {args.trace_db!r} does not exist")
        except ValueError as exc:
            print(f"batchpilot dashboard: {exc}", file=sys.stderr)
            return 2
    if args.url and not args.url.startswith(("http://", "https://")):
        print(f"batchpilot dashboard: --url {args.url!r} must start with http:// or"
              " https://", file=sys.stderr)
        return 2
    print(f"batchpilot: dashboard at http://{args.host}:{args.port}", flush=True)
    command = streamlit_command(args)
    # exec, not a child: the process a supervisor signals (systemd, `make screenshots`, a
    # test) is then Streamlit itself. A parent waiting in subprocess.call died on SIGTERM
    # and left Streamlit running, holding its port.
    os.execv(command[0], command)
    return 0  # reached only where execv is replaced (tests)


def add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="the operator dashboard (Streamlit)",
                       description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group()
    source.add_argument("--url", default=None, help=f"a running server (or ${URL_ENV})")
    source.add_argument("--trace-db", metavar="FILE", help="a trace file, opened read-only;"
                        " a quoted glob ('DIR/replica-*.duckdb') reads a fleet's files as one")
    p.add_argument("--replica", metavar="ID", help="a fleet: show this replica first (the"
                   " sidebar switches between one replica and all)")
    p.add_argument("--host", default="127.0.0.1", help="default %(default)s; a"
                   " non-loopback address needs --allow-public-dashboard")
    p.add_argument("--allow-public-dashboard", action="store_true",
                   help="bind a non-loopback --host although whoever opens the page acts"
                   " with the token (only behind an authenticating proxy)")
    p.add_argument("--port", type=int, default=8501, help="default %(default)s")
    p.add_argument("--token-env", default=TOKEN_ENV, metavar="NAME",
                   help="environment variable holding a control API token (default"
                   " %(default)s); the Control page sends it")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    refusal = public_host_refusal(args.host, args.allow_public_dashboard)
    if refusal is not None:  # checked first: nothing starts on a public address
        print(f"batchpilot dashboard: {refusal}", file=sys.stderr)
        return 2
    if not args.url and not args.trace_db:
        args.url = os.environ.get(URL_ENV)
        if not args.url:
            print("batchpilot dashboard: give --url URL (a running server) or --trace-db"
                  " FILE", file=sys.stderr)
            return 2
    return _dashboard(args)
