"""The body of POST /v1/loadtest/results, `{"runs": [{table: [row, ...]}, ...]}`: how the
load tester splits its results into bodies, and how the server checks one before it writes
anything (control/trace/routes.py).

One entry of `runs` is `store.rows_for_api`'s output for one config: its `loadtest_runs`
row and its `loadtest_requests` rows. A long run does not fit one body (a request row is
~500 bytes of JSON; the server's max_body_bytes is 4 MiB by default), so `bodies_for_api`
sends every config's request rows first, in bodies of at most `max_rows` rows, and the
`loadtest_runs` rows last: a run is listed (GET /v1/loadtest/runs, the dashboard, the
checklist) only once all its requests are stored, and a save that fails half-way leaves
request rows that no listing shows (`control/trace/facts.py` counts only listed runs).
"""

from __future__ import annotations

from typing import Any

from control.api.errors import shown
from control.loadtest.store import REQUESTS_TABLE, RUNS_TABLE, TABLE_COLUMNS

MAX_RUNS = 256  # entries of one body's `runs` (configs x rounds of a --compare)
MAX_ROWS = 20_000  # rows of one body, both tables (4 MiB of JSON holds ~8,000)
ROWS_PER_BODY = 2_000  # what the load tester sends in one body (~1 MB)


class ResultsBodyError(ValueError):
    """A body the server refuses, with the path of what is wrong (`runs[2].loadtest_...`)."""


def bodies_for_api(runs: list[dict[str, list[dict]]], max_rows: int = ROWS_PER_BODY
                   ) -> list[dict[str, Any]]:
    """`runs` (rows_for_api's, one per config) as the bodies to POST in order: all in one
    when they fit `max_rows` (and MAX_RUNS), else request rows first and run rows last."""
    total = sum(len(rows) for run in runs for rows in run.values())
    if total <= max_rows and len(runs) <= MAX_RUNS:
        return [{"runs": runs}]
    bodies: list[dict[str, Any]] = []
    for run in runs:
        requests = run.get(REQUESTS_TABLE, [])
        bodies += [{"runs": [{REQUESTS_TABLE: requests[i:i + max_rows]}]}
                   for i in range(0, len(requests), max_rows)]
    summaries = [{RUNS_TABLE: run[RUNS_TABLE]} for run in runs if run.get(RUNS_TABLE)]
    bodies += [{"runs": summaries[i:i + MAX_RUNS]} for i in range(0, len(summaries), MAX_RUNS)]
    return bodies


def checked_runs(body: Any) -> list[dict[str, list[dict]]]:
    """`body["runs"]`, once its shape and size are as the store takes them; else
    ResultsBodyError naming the first thing wrong. Values' types are checked as the rows
    are converted (store.insert_runs), inside the one transaction that writes them."""
    runs = body.get("runs") if isinstance(body, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ResultsBodyError('the body must be {"runs": [{table: [row, ...]}, ...]}: one'
                               " entry per config, as `batchpilot loadtest` sends them")
    if len(runs) > MAX_RUNS:
        raise ResultsBodyError(f"runs holds {len(runs):,} entries; at most {MAX_RUNS} a"
                               " body (send more bodies)")
    extra = set(body) - {"runs"}
    if extra:
        raise ResultsBodyError(f"unknown field {shown(sorted(extra)[0])}: the body takes"
                               " only runs")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not run:
            raise ResultsBodyError(f"runs[{i}] must be an object of tables"
                                   f" ({', '.join(TABLE_COLUMNS)}) to their rows")
        for table, table_rows in run.items():
            _check_table(f"runs[{i}]", table, table_rows)
    rows = sum(len(table_rows) for run in runs for table_rows in run.values())
    if rows > MAX_ROWS:  # counted before any row is looked at
        raise ResultsBodyError(f"runs holds {rows:,} rows: more than {MAX_ROWS:,} rows a body"
                               " is refused (send more bodies)")
    for i, run in enumerate(runs):
        for table, table_rows in run.items():
            _check_rows(f"runs[{i}].{table}", TABLE_COLUMNS[table], table_rows)
    return runs


def _check_table(where: str, table: str, rows: Any) -> None:
    if table not in TABLE_COLUMNS:
        raise ResultsBodyError(f"{where}: unknown table {shown(table)}; the tables are"
                               f" {', '.join(TABLE_COLUMNS)}")
    if not isinstance(rows, list):
        raise ResultsBodyError(f"{where}.{table} must be a list of rows")


def _check_rows(where: str, columns: frozenset[str], rows: list) -> None:
    for j, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ResultsBodyError(f"{where}[{j}] must be an object")
        unknown = set(row) - columns
        if unknown:
            raise ResultsBodyError(f"{where}[{j}]: unknown column {shown(sorted(unknown)[0])}")
        if not isinstance(row.get("run_id"), str) or not row["run_id"]:
            raise ResultsBodyError(f"{where}[{j}].run_id must be a non-empty string")
