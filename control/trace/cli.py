"""`batchpilot trace`: postmortem questions over a scheduler trace, from its file or a server.

    batchpilot trace --db trace.duckdb summary --since -1h
    batchpilot trace --url http://127.0.0.1:8000 slow --limit 5 --by ttft_s
    batchpilot trace --db trace.duckdb request req-42
    batchpilot trace --db trace.duckdb steps --at 14:02 --before 3 --after 3 --batch
    batchpilot trace --db trace.duckdb export --parquet /tmp/postmortem
    batchpilot trace --db 'traces/replica-*.duckdb' summary      # a fleet's files, as one
    batchpilot trace --url http://FLEET:8000 --replica 1 slow    # one replica of a fleet

--db opens the file read-only and runs control/trace/queries.py in this process; --url (or
$BATCHPILOT_URL) asks the server's /v1/trace/* API, which runs the same queries, with the
read token in $BATCHPILOT_TOKEN (--token-env NAME: another variable) when it is set (a
server with tokens answers nothing without one; a token bound to tenants reads only their
requests, and steps and KV as aggregates). Both give
the same JSON, so one set of formatters (format.py) serves both. Times are parsed here
(timeparse.py, this machine's local time) and sent as epoch seconds.

Exit codes: 0 done; 1 not found, or the server could not be reached or failed; 2 a usage
error, a bad value, or a file that cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from control.cli.ctl import TOKEN_ENV
from control.trace import format as fmt
from control.trace import format_request, queries, report
from control.trace.schema import TABLES
from control.trace.sources import FileSource, TraceError, UrlSource, open_source
from control.trace.timeparse import parse_time

URL_ENV = "BATCHPILOT_URL"
EXPORTS = (*TABLES, "step_requests")  # every table, and the view


# ---- subcommands -----------------------------------------------------------------------
def _summary(args: argparse.Namespace, source: Any) -> Any:
    data = source.ask("summary", since=args.since, until=args.until)
    return data, fmt.summary


def _slow(args: argparse.Namespace, source: Any) -> Any:
    data = source.ask("slow", since=args.since, until=args.until, limit=args.limit,
                      by=args.by)
    return data, lambda rows: fmt.slow(rows, args.by)


def _request(args: argparse.Namespace, source: Any) -> Any:
    return source.ask("request", request_id=args.request_id), format_request.request


def _steps(args: argparse.Namespace, source: Any) -> Any:
    if args.at is not None:
        if args.since is not None or args.until is not None:
            raise TraceError("give --at T, or --since/--until, not both", 2)
        data = source.ask("steps_around", at=args.at, before=args.before, after=args.after)
    elif args.since is None and args.until is None:
        raise TraceError("which steps? give --at T (with --before/--after), or --since T"
                         " and/or --until T", 2)
    else:
        data = source.ask("steps", since=args.since, until=args.until, limit=args.limit,
                          batch=args.batch)
    return data, lambda rows: fmt.steps(rows, args.batch, args.at)


def _export(args: argparse.Namespace, source: Any) -> Any:
    if not isinstance(source, FileSource):
        raise TraceError("export needs the trace file (--db FILE), not a server: stop the"
                         " server, or copy the file together with its .wal and use --db on"
                         " the copy", 2)
    return export_parquet(source, args.parquet), _export_text


def export_parquet(source: FileSource, directory: str) -> dict[str, Any]:
    """One Parquet file per table (and the step_requests view) under `directory`."""
    folder = os.path.abspath(directory)
    if "'" in folder:  # it goes into a SQL string literal: refuse rather than build bad SQL
        raise TraceError(f"--parquet {directory!r}: the path must not contain a single"
                         " quote", 2)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"--parquet {directory!r}: {exc}", 2) from None
    con = source.connect()
    files = []
    try:
        for name in EXPORTS:
            path = os.path.join(folder, f"{name}.parquet")
            rows = con.execute(f"COPY (SELECT * FROM {name}) TO '{path}'"
                               " (FORMAT parquet)").fetchone()[0]
            files.append({"table": name, "path": path, "rows": int(rows)})
    finally:
        con.close()
    return {"directory": folder, "files": files}


def _export_text(data: dict[str, Any]) -> str:
    return "\n".join(fmt.table(["file", ">rows"], [[f["path"], f["rows"]]
                                                   for f in data["files"]], indent=""))


COMMANDS = {"summary": _summary, "slow": _slow, "request": _request, "steps": _steps,
            "export": _export, "report": report.command}


# ---- the parser ------------------------------------------------------------------------
def add_trace_parser(sub: Any) -> None:
    """Register `batchpilot trace` and its subcommands on `batchpilot`'s subparsers."""
    trace = sub.add_parser(
        "trace", help="read the scheduler trace: summary, slow requests, a request's"
        " timeline, steps, Parquet export, postmortem report",
        description="Postmortem questions over the scheduler trace, from its file (--db,"
        " read-only: the server must not hold it) or a running server (--url). Times: epoch"
        " seconds, ISO 8601, 14:02, or -15m.")
    _source_options(trace, None)
    trace.set_defaults(func=run, trace_parser=trace)
    cmds = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the raw JSON")
    _source_options(common, argparse.SUPPRESS)  # also accepted after the subcommand

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return cmds.add_parser(name, help=help_, description=help_, parents=[common])

    p = add("summary", "the window, throughput, KV usage, outcomes, latency, waits, config"
            " changes")
    _window(p)
    p = add("slow", "the slowest requests and where their time went")
    _window(p)
    p.add_argument("--limit", type=int, default=10, metavar="N", help="default %(default)s")
    p.add_argument("--by", default="e2e_s", choices=queries.SLOW_BY,
                   help="what 'slow' means (default %(default)s)")
    p = add("request", "one request's timeline: breakdown, events, the steps it ran in")
    p.add_argument("request_id", metavar="ID")
    p = add("steps", "one line per step: around a moment (--at) or in a window")
    p.add_argument("--at", type=_time, metavar="T", help="the moment to look around")
    p.add_argument("--before", type=int, default=5, metavar="N",
                   help="steps up to --at (default 5)")
    p.add_argument("--after", type=int, default=5, metavar="N", help="steps after --at (default 5)")
    _window(p)
    p.add_argument("--limit", type=int, default=200, metavar="N",
                   help="most steps with --since/--until (default %(default)s)")
    p.add_argument("--batch", action="store_true", help="also list the requests that ran")
    p = add("export", "write every table (and the step_requests view) as Parquet; --db only")
    p.add_argument("--parquet", metavar="DIR", required=True,
                   help="folder for the files (created if missing; files are replaced)")
    p = add("report", "a postmortem draft in Markdown: the config change that caused a"
            " latency regression, timeline, latency before/during/after, KV, rejections")
    _window(p)
    report.add_options(p)


def _source_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--db", metavar="FILE", default=default,
                        help="a trace file, opened read-only (the server must be stopped, or"
                        " use a copy made with its .wal); a quoted glob such as"
                        " 'DIR/replica-*.duckdb' reads a fleet's files as one")
    parser.add_argument("--replica", metavar="ID", default=default,
                        help="a fleet: read this replica only (its file among --db's, or"
                        " through the ingress at --url)")
    parser.add_argument("--url", metavar="URL", default=default,
                        help=f"a running server, e.g. http://127.0.0.1:8000 (default:"
                        f" ${URL_ENV})")
    parser.add_argument("--token-env", metavar="NAME", default=default,
                        help=f"with --url: the variable holding a read token (default"
                        f" {TOKEN_ENV})")


def _window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=_time, metavar="T", help="from this time")
    parser.add_argument("--until", type=_time, metavar="T", help="up to this time")


def _time(text: str) -> float | None:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _source(args: argparse.Namespace) -> FileSource | UrlSource:
    if args.db is not None and args.url is not None:
        raise TraceError("give one of --db FILE or --url URL, not both", 2)
    if args.db is not None:
        return open_source(db=args.db, replica=args.replica)
    url = args.url if args.url is not None else os.environ.get(URL_ENV) or None
    if url is None:
        raise TraceError(f"which trace? give --db FILE (a stopped server's file, or a copy)"
                         f" or --url URL (a running server; or set ${URL_ENV})", 2)
    if not url.startswith(("http://", "https://")):
        raise TraceError(f"--url {url!r} must start with http:// or https://", 2)
    token = os.environ.get(getattr(args, "token_env", None) or TOKEN_ENV)
    return open_source(url=url, replica=args.replica, token=token)


def run(args: argparse.Namespace) -> int:
    """`batchpilot trace ...`: print the answer; on failure, say why on stderr."""
    command = args.trace_command
    if command is None:
        args.trace_parser.print_help(sys.stderr)
        return 2
    try:
        data, text = COMMANDS[command](args, _source(args))
    except TraceError as exc:
        print(f"batchpilot trace {command}: error: {exc}", file=sys.stderr)
        return exc.code
    print(fmt.as_json(data) if args.json else text(data))
    return 0
