"""Where the dashboard reads from, and the time window every page shows.

    streamlit run dashboard/app.py -- --url http://127.0.0.1:8000   # live: read + control API
    streamlit run dashboard/app.py -- --trace-db trace.duckdb       # postmortem: the file

`batchpilot dashboard` starts it that way. Tests set st.session_state["bp_url"] or
["bp_db"] instead of arguments. A live source answers through the server's HTTP APIs (the
server owns its DuckDB file); a file source opens the file read-only per question.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from control.cli.ctl import TOKEN_ENV, URL_ENV, Client, CtlError
from control.trace.sources import FileSource, TraceError, UrlSource

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


def _arguments() -> tuple[str | None, str | None, str]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--url")
    parser.add_argument("--trace-db")
    parser.add_argument("--token-env", default=TOKEN_ENV)
    args, _ = parser.parse_known_args(sys.argv[1:])
    url = st.session_state.get("bp_url") or args.url or os.environ.get(URL_ENV)
    db = st.session_state.get("bp_db") or args.trace_db or os.environ.get(DB_ENV)
    return url, db, st.session_state.get("bp_token_env") or args.token_env


@st.cache_resource(show_spinner=False)
def _context(url: str | None, db: str | None, token_env: str) -> Ctx:
    if db:
        return Ctx(FileSource(db), None, False, f"trace file {db}", token_env)
    return Ctx(UrlSource(url), Client(url, token_env), True, f"server {url}", token_env)


def context() -> Ctx:
    """The page's source; stops the page with a message when none was given."""
    url, db, token_env = _arguments()
    if not url and not db:
        st.error("No source: start with `batchpilot dashboard --url URL` (a running server)"
                 " or `--trace-db FILE` (a trace file).")
        st.stop()
    try:
        return _context(url, db, token_env)
    except CtlError as exc:
        st.error(str(exc))
        st.stop()


def ask(ctx: Ctx, question: str, **params: Any) -> Any:
    """One trace question; an error is shown on the page (never a traceback) and stops it."""
    try:
        if ctx.live:
            return _ask_live(ctx, question, tuple(sorted(params.items())))
        return _ask_file(ctx, question, tuple(sorted(params.items())))
    except TraceError as exc:
        st.error(f"{question}: {exc}")
        st.stop()


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _ask_live(_ctx: Ctx, question: str, params: tuple) -> Any:
    return _ctx.source.ask(question, **dict(params))


@st.cache_data(ttl=FILE_TTL_S, show_spinner=False)
def _ask_file(_ctx: Ctx, question: str, params: tuple) -> Any:
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
