"""The load tester's store (control/loadtest/store.py) where test_loadtest_metrics.py does not
look: a save that fails half way leaves nothing behind and the connection usable, and the
stored prompt tokens are the server's count. Over the recorded run of 8 requests
(fixtures/loadtest_results.json)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from fixtures.loadtest import load_recorded

from control.loadtest.metrics import summarize
from control.loadtest.store import REQUESTS_TABLE, RUNS_TABLE, insert_runs, rows_for_api


@pytest.fixture(scope="module")
def rows() -> dict[str, list[dict]]:
    results, duration_s, slo = load_recorded()
    return rows_for_api("run-1", "mixed-lanes", "baseline", "http://x",
                        summarize(results, duration_s, slo, label="baseline"), results)


def counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    return tuple(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                 for table in (RUNS_TABLE, REQUESTS_TABLE))


def test_a_save_that_fails_half_way_stores_nothing_and_the_next_one_works(rows):
    """The run row goes in before the requests: when a request row is bad, the run row
    must go too, and the connection must not be left inside the failed transaction."""
    con = duckdb.connect()
    bad = {**rows, REQUESTS_TABLE: [*rows[REQUESTS_TABLE][:-1],
                                    {**rows[REQUESTS_TABLE][-1], "sent_at": "soon"}]}
    with pytest.raises(pa.ArrowInvalid, match="soon"):
        insert_runs(con, [bad])
    assert counts(con) == (0, 0)
    insert_runs(con, [rows])
    assert counts(con) == (1, 8)


def test_stored_prompt_tokens_are_the_servers_count(rows):
    """A refused, cancelled or timed-out request got no usage back: 0, not the length the
    scenario planned (which the server never tokenized)."""
    con = duckdb.connect()
    insert_runs(con, [rows])
    got = con.execute(f'SELECT outcome, prompt_tokens FROM {REQUESTS_TABLE} ORDER BY "index"'
                      ).fetchall()
    assert got == [("ok", 100), ("ok", 50), ("ok", 2000), ("ok", 300), ("ok", 120),
                   ("rejected", 0), ("cancelled", 0), ("timeout", 0)]
