"""A fleet's traces as one database: each replica's tables, unioned, with a `replica` column.

`batchpilot fleet --trace-dir DIR` gives each replica its own file (DIR/replica-<id>.duckdb:
one DuckDB file takes one writer). The trace questions (queries.py, series.py, facts.py,
report_queries.py) read unqualified table names, so they run unchanged over an in-memory
database whose `steps`, `requests`, ... are views:

    CREATE VIEW steps AS SELECT *, '0' AS replica FROM r0.steps
                         UNION ALL BY NAME SELECT *, '1' AS replica FROM r1.steps

Aggregates (percentiles, counts) are then the fleet's own, not a merge of per-replica
answers. The parts are either trace files ATTACHed read-only (`open_files`: the replicas
must have stopped, or these are copies) or Parquet exports of a live replica's tables
(`open_parquet`: the ingress's fan-out, control/fleet/trace_fanout.py).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections.abc import Mapping

import duckdb

from control.trace.schema import STEP_REQUESTS_VIEW, TABLES
from control.trace.store import _explain

REPLICA_FILE = re.compile(r"replica-(\w+)\.duckdb$")
GLOB_CHARS = set("*?[")


def is_pattern(path: str) -> bool:
    return bool(GLOB_CHARS & set(path))


def replica_name(path: str) -> str:
    """`DIR/replica-3.duckdb` -> "3" (the fleet's naming); any other file: its stem."""
    found = REPLICA_FILE.search(os.path.basename(path))
    if found:
        return found.group(1)
    return os.path.splitext(os.path.basename(path))[0]


def expand(pattern: str, replica: str | None = None) -> dict[str, str]:
    """The files a glob names -> {replica: path}, in replica order; `replica` keeps one."""
    paths = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not paths:
        raise ValueError(f"--db {pattern!r} matches no file")
    parts: dict[str, str] = {}
    for path in paths:
        name = replica_name(path)
        if name in parts:
            raise ValueError(f"--db {pattern!r}: {parts[name]!r} and {path!r} are both"
                             f" replica {name!r}; name the files replica-<id>.duckdb")
        parts[name] = path
    parts = dict(sorted(parts.items(), key=lambda kv: _order(kv[0])))
    if replica is not None:
        if replica not in parts:
            raise ValueError(f"replica={replica!r} must be one of {', '.join(parts)}"
                             f" (the files {pattern!r} matches)")
        return {replica: parts[replica]}
    return parts


def _order(name: str) -> tuple[int, int | str]:
    # numeric ids first, in number order; ASCII digits only (int('²') raises)
    return (0, int(name)) if name.isascii() and name.isdecimal() else (1, name)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def union_views(con: duckdb.DuckDBPyConnection,
                parts: Mapping[str, Mapping[str, str]]) -> None:
    """parts: replica -> {table: a FROM expression (r0.steps, read_parquet('...'))}. Creates
    one view per table any replica has, each row labelled with its replica."""
    tables = sorted({t for sources in parts.values() for t in sources})
    for table in tables:
        selects = [f"SELECT *, {_quote(replica)} AS replica FROM {sources[table]}"
                   for replica, sources in parts.items() if table in sources]
        con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(selects))
    if {"steps", "request_ids"} <= set(tables):
        con.execute(STEP_REQUESTS_VIEW)


def open_files(paths: Mapping[str, str]) -> duckdb.DuckDBPyConnection:
    """{replica: trace file} -> one in-memory connection over all of them, read-only."""
    con = duckdb.connect(":memory:")
    parts: dict[str, dict[str, str]] = {}
    try:
        for i, (replica, path) in enumerate(paths.items()):
            if not os.path.isfile(path):
                raise ValueError(f"trace DB {path!r} does not exist")
            try:
                con.execute(f"ATTACH {_quote(path)} AS r{i} (READ_ONLY)")
            except duckdb.Error as exc:
                raise ValueError(_explain(path, exc)) from None
            have = {row[0] for row in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_catalog = ?"
                " AND table_type = 'BASE TABLE'", [f"r{i}"]).fetchall()}
            missing = [name for name in TABLES if name not in have]
            if missing:
                raise ValueError(f"{path!r} is not a batchpilot trace (missing tables:"
                                 f" {', '.join(missing)})")
            parts[replica] = {t: f"r{i}.{t}" for t in sorted(have)}
        union_views(con, parts)
    except BaseException:
        con.close()
        raise
    return con


def open_parquet(parts: Mapping[str, Mapping[str, bytes]]) -> duckdb.DuckDBPyConnection:
    """{replica: {table: Parquet bytes}} -> one in-memory connection (the tables copied in,
    so the temporary files are gone when this returns)."""
    con = duckdb.connect(":memory:")
    sources: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="bp-fleet-trace-") as tmp:
        for i, (replica, tables) in enumerate(parts.items()):
            sources[replica] = {}
            for table, data in tables.items():
                path = os.path.join(tmp, f"r{i}-{table}.parquet")
                with open(path, "wb") as f:
                    f.write(data)
                con.execute(f"CREATE TABLE r{i}_{table} AS SELECT * FROM"
                            f" read_parquet({_quote(path)})")
                sources[replica][table] = f"r{i}_{table}"
    union_views(con, sources)
    return con
