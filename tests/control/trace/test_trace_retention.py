"""Trace retention's size limit (control/trace/retention.py): over the limit, the OLDEST
`trim_fraction` of the recorded span goes; the WAL counts towards the size; a limit under
1 MiB is refused."""

from __future__ import annotations

import duckdb
import pytest

from control.api.app import open_trace
from control.serve.settings import ServeSettings
from control.trace.retention import Retention, apply_retention, file_bytes
from control.trace.schema import create_schema


def empty_trace(tmp_path) -> tuple[str, duckdb.DuckDBPyConnection]:
    """(path, connection) of a new trace file with the schema and no rows."""
    path = str(tmp_path / "t.duckdb")
    con = duckdb.connect(path)
    create_schema(con)
    return path, con


def test_over_the_size_limit_the_oldest_fifth_of_the_span_is_deleted(tmp_path):
    path, con = empty_trace(tmp_path)
    con.execute("INSERT INTO steps (run_id, step_id, start_time) SELECT 'r', i, i::DOUBLE"
                " FROM range(1000) t(i)")
    con.execute("CHECKPOINT")
    # apply_retention takes the limit as given (validate() is the settings' check)
    deleted = apply_retention(con, path, Retention(max_bytes=1, trim_fraction=0.2),
                              now=1000.0)
    assert deleted == 200  # start_time 0..199: before 0 + 999 * 0.2
    lo, hi, n = con.execute("SELECT min(start_time), max(start_time), count(*)"
                            " FROM steps").fetchone()
    assert (lo, hi, n) == (200, 999, 800)  # the newest steps are kept


def test_the_wal_counts_towards_the_size(tmp_path):
    path = str(tmp_path / "t.duckdb")
    (tmp_path / "t.duckdb").write_bytes(b"x" * 10)
    assert file_bytes(path) == 10
    (tmp_path / "t.duckdb.wal").write_bytes(b"x" * 25)
    assert file_bytes(path) == 35


def test_a_size_limit_under_one_mib_is_refused():
    assert Retention(max_bytes=1 << 20).validate().max_bytes == 1 << 20
    with pytest.raises(ValueError, match="at least 1 MiB"):
        Retention(max_bytes=(1 << 20) - 1).validate()
    with pytest.raises(ValueError, match="at least 1 MiB"):
        Retention(max_bytes=1 << 19).validate()


def test_retention_by_age_keeps_the_run_rows(tmp_path):
    """A run older than the age limit keeps its `runs` row (model, settings): its steps
    and requests go, what the run was stays."""
    path, con = empty_trace(tmp_path)
    con.execute("INSERT INTO runs (run_id, started, model, settings) VALUES"
                " ('old', 10, 'm', '{}')")
    con.execute("INSERT INTO steps (run_id, step_id, start_time) VALUES ('old', 1, 20)")
    assert apply_retention(con, path, Retention(max_age_s=100), now=1000.0) == 1
    assert con.execute("SELECT run_id, model FROM runs").fetchall() == [("old", "m")]


def test_the_servers_trace_keeps_the_retention_it_was_given(tmp_path):
    """--trace-max-age-s and --trace-max-bytes reach the server's trace writer: dropped on
    the way, the trace file would grow without bound."""
    settings = ServeSettings(model="tiny", trace_db=str(tmp_path / "t.duckdb"),
                             trace_max_age_s=3600.0, trace_max_bytes=64 << 20)
    writer = open_trace(settings, "run-1")
    try:
        assert writer.settings.retention == Retention(max_age_s=3600.0, max_bytes=64 << 20)
    finally:
        writer.stop()
