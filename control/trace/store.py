"""Opening a trace database file, with errors an operator can act on.

DuckDB lets one process hold a file read-write and then refuses every other process,
read-only ones included: while a server writes the trace, read it through the server's
URL (`batchpilot trace --url ...`), or copy the file (with its .wal) and open the copy.
"""

from __future__ import annotations

import os
import re

import duckdb

from control.trace.schema import TABLES


def _explain(path: str, exc: Exception) -> str:
    text = str(exc)
    # NOTE: another process holding the file: a lock error; this process (a fleet of
    # in-process replicas, a test): DuckDB's "unique file handle conflict"
    if "lock" in text.lower() or "file handle conflict" in text.lower():
        pid = re.search(r"PID (\d+)", text)
        holder = f" (process {pid.group(1)})" if pid else ""
        return (f"trace DB {path!r} is held by another process{holder}, probably a running"
                " server: query it with `batchpilot trace --url http://HOST:PORT ...`, or"
                " copy the file (and its .wal) and open the copy")
    return f"trace DB {path!r} cannot be opened: {text}"


def check_trace_db(path: str | None) -> None:
    """Fail before a server loads its model if it could not write the trace at `path`."""
    if not path:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"trace DB {path!r}: directory {parent!r} does not exist")
    try:
        duckdb.connect(path).close()
    except duckdb.Error as exc:
        raise ValueError(_explain(path, exc)) from None


def open_read_only(path: str) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a trace file (after the server stopped, or a copy)."""
    if not os.path.isfile(path):
        raise ValueError(f"trace DB {path!r} does not exist")
    try:
        con = duckdb.connect(path, read_only=True)
    except duckdb.Error as exc:
        raise ValueError(_explain(path, exc)) from None
    have = {row[0] for row in con.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}
    missing = [name for name in TABLES if name not in have]
    if missing:
        con.close()
        raise ValueError(f"{path!r} is not a batchpilot trace (missing tables:"
                         f" {', '.join(missing)})")
    return con
