"""Where the dashboard reads from, and the time window every page shows.

    streamlit run dashboard/app.py -- --url http://127.0.0.1:8000   # live: read + control API
    streamlit run dashboard/app.py -- --trace-db trace.duckdb       # postmortem: the file
    streamlit run dashboard/app.py -- --trace-db 'DIR/replica-*.duckdb'  # a fleet's files

`batchpilot dashboard` starts it that way. Tests set st.session_state["bp_url"] or
["bp_db"] instead of arguments. A live source answers through the server's HTTP APIs (the
server owns its DuckDB file); a file source opens the file read-only per question.

A fleet reads as one: its ingress's URL (which fans trace reads out to every replica) or a
glob of its replicas' files. The sidebar then offers one replica or all (`--replica ID`
picks the first choice), and tables whose rows come from several replicas lead with a
`replica` column (`columns()`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from control.cli.ctl import TOKEN_ENV, URL_ENV, Client
from control.cli.ctl_error import CtlError
from control.cli.http_json import HTTPFailure, request_json
from control.trace.fleet_db import expand, is_pattern
from control.trace.sources import FileSource, TraceError, UrlSource, open_source

DB_ENV = "BATCHPILOT_TRACE_DB"
WINDOWS_S = {"5 min": 300, "15 min": 900, "1 h": 3600, "6 h": 21600, "24 h": 86400,
             "all": None}
LIVE_TTL_S, FILE_TTL_S = 2.0, 600.0  # how long an answer is reused


@dataclass(frozen=True)
class Ctx:
    source: FileSource | UrlSource
    control: Client | None  # live only: the control API (config, history, changes)
    live: bool
    label: str  # what the sidebar says it is reading
    token_env: str = TOKEN_ENV
    replica: str | None = None  # a fleet: the replica read (None: all of them)


def _arguments() -> tuple[str | None, str | None, str, str | None]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--url")
    parser.add_argument("--trace-db")
    parser.add_argument("--token-env", default=TOKEN_ENV)
    parser.add_argument("--replica")
    args, _ = parser.parse_known_args(sys.argv[1:])
    url = st.session_state.get("bp_url") or args.url or os.environ.get(URL_ENV)
    db = st.session_state.get("bp_db") or args.trace_db or os.environ.get(DB_ENV)
    replica = st.session_state.get("bp_replica") or args.replica
    return url, db, st.session_state.get("bp_token_env") or args.token_env, replica


@st.cache_resource(show_spinner=False)
def _context(url: str | None, db: str | None, token_env: str,
             replica: str | None = None) -> Ctx:
    one = f", replica {replica}" if replica is not None else ""
    if db:
        source = open_source(db=db, replica=replica)
        kind = "trace files" if is_pattern(db) else "trace file"
        return Ctx(source, None, False, f"{kind} {db}{one}", token_env, replica)
    # every trace read carries the token: a server with tokens answers nothing without one,
    # and one bound to tenants shows their requests only (the server scopes its answers)
    source = UrlSource(url, replica, os.environ.get(token_env))
    return Ctx(source, Client(url, token_env), True, f"server {url}{one}", token_env,
               replica)


@st.cache_data(ttl=60, show_spinner=False)
def replicas(url: str | None, db: str | None) -> list[str]:
    """A fleet's replica ids (its files, or its ingress's /readyz); [] for one server."""
    try:
        if db:
            return list(expand(db)) if is_pattern(db) else []
        ready = request_json(url.rstrip("/"), "/readyz", timeout_s=5.0)
    except HTTPFailure as exc:
        ready = exc.body if exc.status == 503 else {}
    except ValueError:
        return []  # the source's own question will say what is wrong with it
    return [str(r["replica_id"]) for r in (ready or {}).get("replicas") or ()
            if "replica_id" in r]


def _pick_replica(url: str | None, db: str | None, wanted: str | None) -> str | None:
    ids = replicas(url, db)
    if len(ids) < 2:
        return wanted
    options = ["all", *ids]
    index = options.index(wanted) if wanted in options else 0
    choice = st.sidebar.selectbox("Replica", options, index=index, key="bp_replica_pick",
                                  help="This fleet's replicas: all of them as one, or one")
    return None if choice == "all" else choice


def columns(table: Any, names: list[str]) -> list[str]:
    """`names`, led by `replica` when the rows come from several replicas of a fleet."""
    if "replica" in getattr(table, "columns", ()) and table["replica"].nunique() > 1:
        return ["replica", *names]
    return names


def context() -> Ctx:
    """The page's source; stops the page with a message when none was given."""
    url, db, token_env, replica = _arguments()
    if not url and not db:
        st.error("No source: start with `batchpilot dashboard --url URL` (a running server)"
                 " or `--trace-db FILE` (a trace file).")
        st.stop()
    try:
        return _context(url, db, token_env, _pick_replica(url, db, replica))
    except CtlError as exc:
        st.error(str(exc))
        st.stop()


def ask(ctx: Ctx, question: str, **params: Any) -> Any:
    """One trace question; an error is shown on the page (never a traceback) and stops it."""
    try:
        # NOTE: st.cache_data does not hash `_ctx`; the label names the source (and the
        # replica), so one fleet replica's answers are not served for all of them
        if ctx.live:
            return _ask_live(ctx, ctx.label, question, tuple(sorted(params.items())))
        return _ask_file(ctx, ctx.label, question, tuple(sorted(params.items())))
    except TraceError as exc:
        st.error(f"{question}: {exc}")
        st.stop()


def ask_shared(ctx: Ctx, question: str, **params: Any) -> Any:
    """A question about the whole server (config changes), [] where the token is bound to
    tenants (the server answers 403: not theirs to see), so their pages still draw."""
    try:
        if ctx.live:
            return _ask_live(ctx, ctx.label, question, tuple(sorted(params.items())))
        return _ask_file(ctx, ctx.label, question, tuple(sorted(params.items())))
    except TraceError as exc:
        if exc.status == 403:
            return []
        st.error(f"{question}: {exc}")
        st.stop()


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _ask_live(_ctx: Ctx, label: str, question: str, params: tuple) -> Any:
    return _ctx.source.ask(question, **dict(params))


@st.cache_data(ttl=FILE_TTL_S, show_spinner=False)
def _ask_file(_ctx: Ctx, label: str, question: str, params: tuple) -> Any:
    return _ctx.source.ask(question, **dict(params))


def window(ctx: Ctx) -> tuple[float | None, float | None]:
    """The sidebar's time window as (since, until) epoch seconds. Live: up to now; a file:
    up to its last step, so an old trace's last hour is its own, not an empty one."""
    st.sidebar.caption(f"Reading {ctx.label}")
    default = 1 if ctx.live else len(WINDOWS_S) - 1  # live: 15 min; a file: all of it
    choice = st.sidebar.selectbox("Window", list(WINDOWS_S), index=default, key="bp_window")
    if ctx.live and st.sidebar.button("Refresh", key="bp_refresh"):
        st.cache_data.clear()
    span = WINDOWS_S[choice]
    if span is None:
        return None, None
    until = time.time() if ctx.live else last_time(ctx)
    if until is None:
        return None, None
    return until - span, until


def last_time(ctx: Ctx) -> float | None:
    steps = ask(ctx, "summary")["steps"]
    return steps.get("last")
