"""What a trace read shows a caller whose read token is bound to tenants, in one place.

A bound caller (control/admin/auth.py `Caller.tenants`) sees its tenants' requests, and of
what mixes every tenant (steps, KV snapshots) aggregates only. `scope(con, tenants)` does
that for every question at once (queries.py, series.py, report_queries.py, the Parquet
export, a fleet's union of replicas): on `con`, a connection of the read's own, TEMP views
named like the tables shadow them (DuckDB resolves an unqualified name in the temp catalog
first, persistent views included, and keeps TEMP objects per connection: `con.close()`
drops them, and no other reader sees them). So the queries run unchanged and read:

    requests, admissions  the tenants' rows only
    request_ids           the numbers of those requests only
    steps                 every step (tokens, KV, lanes, counts, finish reasons), with each
                          id of another tenant's request (admitted, preempted, finished)
                          and each number of one (decode_seqs, prefill_seqs) NULL: a list
                          keeps its length, so counts (preemptions, seqs) stay the server's
    step_requests         the view again, over the two above
    kv_snapshots          by_tenant with the tenants' own entries only; the rest kept
    runs                  settings NULL (the server's config)
    config_changes        no rows (actors, notes: its route answers 403 to a bound caller)

Tenant names are hostile input: they reach DuckDB only as bound parameters, into a TEMP
table the views read; no SQL is built from them. A table of schema.TABLES without a rule
here fails the read (`scope` raises): a table added later is hidden until someone decides.
The routes that 403 a bound caller instead (config changes, checklist, load tests,
what-if) say why in their modules (control/trace/routes.py, control/whatif/routes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from control.trace.schema import STEP_REQUESTS_VIEW, TABLES

TENANTS = "bp_scope_tenants"  # (tenant): the caller's tenants, bound as parameters
OWN_IDS = "bp_scope_own_ids"  # (run_id, request_id): the tenants' requests
OWN_SEQS = "bp_scope_own_seqs"  # (run_id, bits): their numbers (request_ids.seq) as bits
ID_LISTS = ("admitted", "preempted", "finished")  # str[] of request ids
SEQ_LISTS = ("decode_seqs", "prefill_seqs")  # int[] of request numbers (request_ids.seq)
# table -> the rule its shadow follows; every table of schema.TABLES needs one
RULES = {"requests": "tenant", "admissions": "tenant", "request_ids": "own",
         "steps": "aggregate", "kv_snapshots": "aggregate", "runs": "aggregate",
         "config_changes": "hidden"}

# Questions (control/trace/sources.py QUESTIONS) and tables a bound caller may not read at
# all (403, control/admin/auth.py require_unbound), with what they are, for its message
UNBOUND_ONLY = {
    "config_changes": "the config audit (who changed what, and why)",
    "checklist_facts": "the go-live checklist (the server's settings, every tenant's"
                       " cancellations)",
    "loadtest_runs": "load-test results (the operator's capacity tests)",
    "loadtest_stats": "load-test results (the operator's capacity tests)",
}
UNBOUND_TABLES = {"config_changes": UNBOUND_ONLY["config_changes"],
                  "loadtest_runs": UNBOUND_ONLY["loadtest_runs"],
                  "loadtest_requests": UNBOUND_ONLY["loadtest_runs"]}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def scope(con: Any, tenants: Sequence[str]) -> Any:
    """Shadow `con`'s tables with `tenants`' view of them (see the module docstring) and
    return `con`. `con` must be a connection of this read only (a cursor), never shared."""
    missing = sorted(set(TABLES) - set(RULES))
    if missing:  # fail closed: a new table shows nothing until it has a rule
        raise RuntimeError(f"tenant_scope has no rule for table(s) {', '.join(missing)}")
    if not tenants:
        raise ValueError("a bound caller has at least one tenant")
    db = _quote(con.execute("SELECT current_database()").fetchone()[0])

    def src(table: str) -> str:  # the real table (or a fleet's union view) under the shadow
        return f"{db}.main.{table}"

    def temp(kind: str, name: str, sql: str) -> None:
        con.execute(f"CREATE OR REPLACE TEMP {kind} {name} AS {sql}")

    con.execute(f"CREATE OR REPLACE TEMP TABLE {TENANTS} (tenant VARCHAR)")
    con.executemany(f"INSERT INTO {TENANTS} VALUES (?)", [[t] for t in tenants])
    for table in ("requests", "admissions"):
        temp("VIEW", table, f"SELECT * FROM {src(table)}"
             f" WHERE tenant IN (SELECT tenant FROM {TENANTS})")
    # the tenants' requests, once per read: the step lists are checked against these
    temp("TABLE", OWN_IDS, "SELECT run_id, request_id FROM requests"
         " UNION SELECT run_id, request_id FROM admissions")  # UNION: distinct pairs
    temp("VIEW", "request_ids", f"SELECT i.* FROM {src('request_ids')} i SEMI JOIN {OWN_IDS}"
         " o ON o.run_id = i.run_id AND o.request_id = i.request_id")
    _own_seqs(con)
    head = _lambda(con)
    temp("VIEW", "steps", _steps(src("steps"), head("q")))
    temp("VIEW", "kv_snapshots", f"SELECT k.* REPLACE (map_from_entries(list_filter("
         f"map_entries(k.by_tenant), {head('e')} list_contains(t.names, e.key)))"
         f" AS by_tenant) FROM {src('kv_snapshots')} k,"
         f" (SELECT list(tenant) AS names FROM {TENANTS}) t")
    temp("VIEW", "runs", f"SELECT * REPLACE (NULL::VARCHAR AS settings) FROM {src('runs')}")
    temp("VIEW", "config_changes", f"SELECT * FROM {src('config_changes')} WHERE FALSE")
    # NOTE: the persistent step_requests view would read the shadows too (DuckDB binds a
    # view's names when it is queried); a TEMP one says so rather than rely on it
    con.execute(STEP_REQUESTS_VIEW.replace("CREATE OR REPLACE VIEW",
                                           "CREATE OR REPLACE TEMP VIEW"))
    return con


def _own_seqs(con: Any) -> None:
    """Per run, the tenants' request numbers as a bitstring (bit seq - lo set): a step's
    list of numbers (up to max_num_seqs of them) is then checked in O(1) per number."""
    lo, hi = con.execute("SELECT min(seq), max(seq) FROM request_ids").fetchone()
    if lo is None:  # none of theirs ran: no bits, every number NULL
        con.execute(f"CREATE OR REPLACE TEMP TABLE {OWN_SEQS} (run_id VARCHAR, lo BIGINT,"
                    " hi BIGINT, bits BIT)")
        return
    lo, hi = int(lo), int(hi)  # numbers from the trace, not the caller: safe in the SQL
    con.execute(f"CREATE OR REPLACE TEMP TABLE {OWN_SEQS} AS SELECT run_id, {lo} AS lo,"
                f" {hi} AS hi, bitstring_agg(seq, {lo}, {hi}) AS bits FROM request_ids"
                " GROUP BY run_id")


def _lambda(con: Any) -> Callable[[str], str]:
    """A lambda's head in the syntax this DuckDB takes: `lambda q:` from 1.3 on (2.0
    refuses the arrow unless told), `q ->` before."""
    try:
        con.execute("SELECT list_transform([1], lambda q: q)")
        return lambda name: f"lambda {name}:"
    except duckdb.Error:
        return lambda name: f"{name} ->"


def _own_list(steps: str, column: str) -> str:
    """Per step: `column` (request ids) with each id not the tenants' NULL, in its order.
    A hash join over the lists' elements (about two per request: admitted, finished)."""
    return f"""
        SELECT e.run_id, e.step_id,
               list(CASE WHEN o.request_id IS NOT NULL THEN e.x END ORDER BY e.i) AS v
        FROM (SELECT run_id, step_id, unnest({column}) AS x,
                     generate_subscripts({column}, 1) AS i FROM {steps}) e
        LEFT JOIN {OWN_IDS} o ON o.run_id = e.run_id AND o.request_id = e.x
        GROUP BY e.run_id, e.step_id"""


def _steps(steps: str, arrow: str) -> str:
    """Every step, other tenants' request ids and numbers NULL (a step without elements in
    a list keeps it as it is, empty or NULL: coalesce)."""
    ids = ", ".join(f"coalesce(j{i}.v, s.{c}) AS {c}" for i, c in enumerate(ID_LISTS))
    seqs = ", ".join(
        f"list_transform(s.{c}, {arrow} CASE WHEN q BETWEEN b.lo AND b.hi AND"
        f" get_bit(b.bits, (q - b.lo)::INTEGER) = 1 THEN q END) AS {c}" for c in SEQ_LISTS)
    joins = " ".join(f"LEFT JOIN ({_own_list(steps, c)}) j{i}"
                     f" ON j{i}.run_id = s.run_id AND j{i}.step_id = s.step_id"
                     for i, c in enumerate(ID_LISTS))
    return (f"SELECT s.* REPLACE ({ids}, {seqs}) FROM {steps} s"
            f" LEFT JOIN {OWN_SEQS} b ON b.run_id = s.run_id {joins}")
