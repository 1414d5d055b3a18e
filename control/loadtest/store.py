"""Load-test results in DuckDB: one `loadtest_runs` row per (run, config) and one
`loadtest_requests` row per request sent.

A run_id may hold several configs (an A B A B comparison): `label` tells them apart.
Times are seconds: `started` and `sent_at` since the epoch, the others from the moment
the request was sent. `lane` is NULL where the server routed the request; `prompt_tokens`
and `output_tokens` are as the server counted them (0: no usage came back). `server_ttft_s`
and `server_e2e_s` are the server's own timing; `ttft_gap_s` and `e2e_gap_s` the client's
minus the server's (NULL unless both are known; metrics.ttft_gap_s, e2e_gap_s). Tables
made before a column existed get it when first written to again (NULL in older rows).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict

import duckdb
import pyarrow as pa

from control.loadtest.metrics import Summary, e2e_gap_s, itls_s, tpot_s, ttft_gap_s
from control.loadtest.records import RequestResult

RUNS_TABLE = "loadtest_runs"
REQUESTS_TABLE = "loadtest_requests"

# DuckDB type -> Arrow type of the batch inserted
_ARROW = {"VARCHAR": pa.string(), "JSON": pa.string(), "DOUBLE": pa.float64(),
          "BIGINT": pa.int64(), "BOOLEAN": pa.bool_()}

_RUN_DISTS = ("ttft", "tpot", "itl", "e2e", "ttft_gap", "e2e_gap")  # p50, p99 columns

RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "VARCHAR"), ("started", "DOUBLE"), ("scenario", "VARCHAR"),
    ("label", "VARCHAR"), ("url", "VARCHAR"), ("duration_s", "DOUBLE"),
    ("summary", "JSON"),  # dataclasses.asdict(Summary); metrics.summary_from_dict reads it
    ("requests", "BIGINT"), ("ok", "BIGINT"), ("goodput_rps", "DOUBLE"),
    ("request_rps", "DOUBLE"), ("output_tps", "DOUBLE"),
    *((f"{name}_{stat}", "DOUBLE") for name in _RUN_DISTS for stat in ("p50", "p99")),
)

REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "VARCHAR"), ("index", "BIGINT"), ("label", "VARCHAR"), ("tenant", "VARCHAR"),
    ("lane", "VARCHAR"), ("kind", "VARCHAR"), ("stream", "BOOLEAN"),
    ("prompt_tokens", "BIGINT"), ("output_tokens", "BIGINT"), ("outcome", "VARCHAR"),
    ("http_status", "BIGINT"), ("error", "VARCHAR"), ("request_id", "VARCHAR"),
    ("sent_at", "DOUBLE"), ("ttft_s", "DOUBLE"), ("tpot_s", "DOUBLE"), ("e2e_s", "DOUBLE"),
    ("itl_mean_s", "DOUBLE"), ("itl_max_s", "DOUBLE"),
    ("cancelled_after_s", "DOUBLE"),  # the planned cancel, for requests that were cancelled
    ("server_ttft_s", "DOUBLE"), ("server_e2e_s", "DOUBLE"),
    ("ttft_gap_s", "DOUBLE"), ("e2e_gap_s", "DOUBLE"),  # client - server
    ("sends", "BIGINT"),  # 1 + the client's resends after refusals (--client-retries)
)

_TABLES = {RUNS_TABLE: RUN_COLUMNS, REQUESTS_TABLE: REQUEST_COLUMNS}
TABLE_COLUMNS = {table: frozenset(name for name, _ in columns)
                 for table, columns in _TABLES.items()}


def create_tables(con: duckdb.DuckDBPyConnection) -> None:
    for table, columns in _TABLES.items():
        cols = ", ".join(f'"{name}" {kind}' for name, kind in columns)
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
        for name, kind in columns:  # a table from an older batchpilot lacks the newer ones
            con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{name}" {kind}')


def _run_row(run_id: str, started: float | None, scenario: str, label: str, url: str,
             s: Summary) -> dict:
    row = {"run_id": run_id, "started": started, "scenario": scenario, "label": label,
           "url": url, "duration_s": s.duration_s, "summary": json.dumps(asdict(s)),
           "requests": s.requests, "ok": s.ok, "goodput_rps": s.goodput_rps,
           "request_rps": s.request_rps, "output_tps": s.output_tps}
    for name in _RUN_DISTS:
        dist = getattr(s, name)
        row[f"{name}_p50"], row[f"{name}_p99"] = dist.p50, dist.p99
    return row


def _request_row(run_id: str, label: str, r: RequestResult) -> dict:
    p = r.planned
    itls = itls_s(r)
    return {
        "run_id": run_id, "index": p.index, "label": label, "tenant": p.tenant,
        "lane": p.lane, "kind": p.kind, "stream": p.stream, "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens, "outcome": r.outcome, "http_status": r.http_status,
        "error": r.error, "request_id": r.request_id, "sent_at": r.sent_at,
        "ttft_s": r.ttft_s, "tpot_s": tpot_s(r), "e2e_s": r.e2e_s,
        "itl_mean_s": sum(itls) / len(itls) if itls else None,
        "itl_max_s": max(itls) if itls else None,
        "cancelled_after_s": p.cancel_after_s if r.outcome == "cancelled" else None,
        "server_ttft_s": r.server_ttft_s, "server_e2e_s": r.server_e2e_s,
        "ttft_gap_s": ttft_gap_s(r), "e2e_gap_s": e2e_gap_s(r), "sends": r.sends,
    }


def rows_for_api(run_id: str, scenario: str, label: str, url: str, summary: Summary,
                 results: list[RequestResult], started: float | None = None
                 ) -> dict[str, list[dict]]:
    """{table name: JSON-able rows}, exactly what `save` inserts. `started`: epoch seconds,
    by default the first request's sent_at (None when nothing was sent)."""
    if started is None:
        sent = [r.sent_at for r in results if r.sent_at]
        started = min(sent) if sent else None
    return {RUNS_TABLE: [_run_row(run_id, started, scenario, label, url, summary)],
            REQUESTS_TABLE: [_request_row(run_id, label, r) for r in results]}


def insert_rows(con: duckdb.DuckDBPyConnection, rows: dict[str, list[dict]]) -> None:
    """Insert rows_for_api's output (tables created if missing), all or nothing."""
    insert_runs(con, [rows])


def insert_runs(con: duckdb.DuckDBPyConnection, runs: list[dict[str, list[dict]]]) -> None:
    """Insert several rows_for_api outputs in one transaction: all or nothing, one insert
    per table whatever the number of runs."""
    create_tables(con)
    con.begin()
    try:
        for table, columns in _TABLES.items():
            table_rows = [row for run in runs for row in run.get(table, ())]
            if table_rows:
                _insert(con, table, columns, table_rows)
        con.commit()
    except BaseException:
        con.rollback()
        raise


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[tuple[str, str], ...],
            table_rows: list[dict]) -> None:
    schema = pa.schema([(name, _ARROW[kind]) for name, kind in columns])
    batch = pa.Table.from_pylist(table_rows, schema=schema)
    cols = ", ".join(f'"{name}"' for name, _ in columns)
    con.register("_loadtest_batch", batch)
    try:
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _loadtest_batch")
    finally:
        with contextlib.suppress(Exception):  # fails too after an aborted transaction
            con.unregister("_loadtest_batch")


def save(con: duckdb.DuckDBPyConnection, run_id: str, scenario: str, label: str, url: str,
         summary: Summary, results: list[RequestResult], started: float | None = None) -> None:
    """Store one config's run: its summary row and one row per request."""
    insert_rows(con, rows_for_api(run_id, scenario, label, url, summary, results, started))


def save_to_file(path: str, run_id: str, scenario: str, label: str, url: str,
                 summary: Summary, results: list[RequestResult],
                 started: float | None = None) -> None:
    """`save` into the DuckDB file at `path` (created if missing), then close it."""
    con = duckdb.connect(path)
    try:
        save(con, run_id, scenario, label, url, summary, results, started)
    finally:
        con.close()
