"""`batchpilot checklist`: decide the go-live checklist and gate a deployment on it.

    batchpilot checklist --url http://127.0.0.1:8000 --markdown go-live.md
    batchpilot checklist --trace-db trace.duckdb --loadtest-db results/loadtest.duckdb
    batchpilot checklist --url $URL --strict --json      # in a deployment pipeline

--url reads the live config, /control/history and /metrics (token from the environment
variable --token-env names, default BATCHPILOT_TOKEN, as `batchpilot ctl`) and the trace
and load-test results through the server's read API; --trace-db reads a trace file (a
postmortem: no live config, so config items decide only what the trace recorded).

Exit codes: 0 nothing fails; 1 an item fails (--strict: or needs evidence); 2 a usage
error: a bad spec, a file that cannot be read, a server that cannot be reached, a token
refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

URL_ENV = "BATCHPILOT_URL"


def add_checklist_parser(sub: Any) -> None:
    """Register `batchpilot checklist` on `batchpilot`'s subparsers."""
    from control.checklist.client import TOKEN_ENV
    from control.checklist.evidence import REPO_ROOT
    from control.checklist.spec import DEFAULT_SPEC

    p = sub.add_parser(
        "checklist", help="decide the go-live checklist (pass / fail / needs-evidence)",
        description="Decide each item of the go-live checklist from a running server or a"
        " trace file, show the evidence, and exit 1 if any item fails.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", metavar="URL",
                       help=f"a running server (default ${URL_ENV} when --trace-db is not"
                       " given)")
    where.add_argument("--trace-db", metavar="FILE", help="a trace file (server stopped); a"
                       " quoted glob ('DIR/replica-*.duckdb') reads a fleet's files as one")
    p.add_argument("--replica", metavar="ID",
                   help="a fleet (`batchpilot fleet`): check this replica only")
    p.add_argument("--token-env", metavar="NAME", default=TOKEN_ENV,
                   help="environment variable holding the control API token (default"
                   " %(default)s)")
    p.add_argument("--loadtest-db", metavar="FILE",
                   help="load-test results saved with `batchpilot loadtest --db FILE`")
    p.add_argument("--spec", metavar="FILE", default=str(DEFAULT_SPEC),
                   help="the checklist (default playbooks/checklist.yaml)")
    p.add_argument("--repo", metavar="DIR", default=str(REPO_ROOT),
                   help="repository with grafana/ (default: this checkout)")
    p.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--strict", action="store_true",
                   help="needs-evidence counts as a failure (exit 1)")
    p.set_defaults(func=run, checklist_parser=p)


def run(args: argparse.Namespace) -> int:
    from control.checklist import (
        ChecklistError,
        ControlClient,
        LoadtestFile,
        evaluate,
        exit_code,
        gather_evidence,
        load_spec,
        to_json,
        to_markdown,
        to_text,
    )
    from control.trace.sources import UrlSource, open_source

    url = args.url or (None if args.trace_db else os.environ.get(URL_ENV))
    if not url and not args.trace_db:
        args.checklist_parser.error(f"give --url URL or --trace-db FILE (or set ${URL_ENV})")
    try:
        spec = load_spec(args.spec)
        if url:
            source = UrlSource(url, args.replica, os.environ.get(args.token_env))
            control = ControlClient(url, args.token_env, replica=args.replica)
        else:
            source, control = open_source(db=args.trace_db, replica=args.replica), None
        loadtests = LoadtestFile(args.loadtest_db) if args.loadtest_db else None
        evidence = gather_evidence(source, control, repo_root=args.repo, spec=spec,
                                   loadtest_source=loadtests)
        results = evaluate(spec, evidence)
        if args.markdown:
            _write(args.markdown, to_markdown(results, source=url or args.trace_db))
    except ChecklistError as exc:
        print(f"batchpilot checklist: error: {exc}", file=sys.stderr)
        return exc.code
    utf8 = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
    print(to_json(results) if args.json else to_text(results, ascii_only=not utf8))
    return exit_code(results, args.strict)


def _write(path: str, text: str) -> None:
    from control.checklist.result import ChecklistError

    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise ChecklistError(f"--markdown {path!r} cannot be written: {exc.strerror}"
                             ) from None
