"""A tenant-bound reader's tables, row by row (control/trace/tenant_scope.py), on a small
hand-made trace: its request still running (admitted, not yet in `requests`) is its own in
steps and request_ids; the server's settings in `runs` are hidden from it. And the Parquet
export's window (control/trace/export_route.py) keeps a row on the window's edge."""

from __future__ import annotations

import duckdb
import pytest

from control.trace.export_route import _window
from control.trace.schema import create_schema
from control.trace.tenant_scope import scope


@pytest.fixture
def con():
    c = duckdb.connect()
    create_schema(c)
    c.execute("INSERT INTO runs (run_id, started, model, settings) VALUES"
              " ('r', 0, 'm', '{\"api_key_env\": \"SECRET\", \"max_num_seqs\": 8}')")
    c.execute("INSERT INTO admissions (run_id, time, request_id, tenant, kind) VALUES"
              " ('r', 1, 'mine-running', 'acme', 'admitted'),"
              " ('r', 1, 'theirs', 'zeta', 'admitted')")
    c.execute("INSERT INTO request_ids (run_id, seq, request_id, time) VALUES"
              " ('r', 0, 'mine-running', 1), ('r', 1, 'theirs', 1)")
    c.execute("INSERT INTO steps (run_id, step_id, start_time, admitted, decode_seqs) VALUES"
              " ('r', 1, 1, ['mine-running', 'theirs'], [0, 1])")
    yield c
    c.close()


def test_a_running_request_of_the_tenant_is_its_own_in_steps_and_request_ids(con):
    scope(con, ["acme"])
    admitted, seqs = con.execute("SELECT admitted, decode_seqs FROM steps").fetchone()
    assert admitted == ["mine-running", None]
    assert seqs == [0, None]
    assert con.execute("SELECT request_id FROM request_ids").fetchall() == [("mine-running",)]


def test_a_bound_reader_gets_no_server_settings_from_runs(con):
    scope(con, ["acme"])
    assert con.execute("SELECT run_id, model, settings FROM runs").fetchall() == [
        ("r", "m", None)]


@pytest.mark.parametrize(("table", "column"), [("request_ids", "time"),
                                               ("requests", "arrival_time")])
def test_the_export_window_keeps_rows_up_to_and_at_until(table, column):
    c = duckdb.connect()
    create_schema(c)
    for i, t in enumerate((5.0, 10.0, 15.0)):
        if table == "request_ids":
            c.execute("INSERT INTO request_ids (run_id, seq, request_id, time) VALUES"
                      " ('r', ?, ?, ?)", [i, f"q{i}", t])
        else:
            c.execute("INSERT INTO requests (run_id, request_id, arrival_time) VALUES"
                      " ('r', ?, ?)", [f"q{i}", t])
    where, params = _window(table, None, 10.0)
    got = c.execute(f"SELECT request_id, {column} FROM {table} WHERE {where}"
                    " ORDER BY 2", params).fetchall()
    assert got == [("q0", 5.0), ("q1", 10.0)]
    c.close()
