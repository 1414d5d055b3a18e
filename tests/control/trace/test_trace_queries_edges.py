"""The trace's postmortem queries (control/trace/queries.py) over a few hand-written rows in
an in-memory DuckDB: a window's both ends, an empty window refused, rejections out of the
latency percentiles, the step sizes a slow request waited through up to its first token,
steps around a moment in time order, and a resent request id's latest request."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from control.trace import queries
from control.trace.schema import create_schema


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(":memory:")
    create_schema(con)
    yield con
    con.close()


def insert(con, table: str, **row) -> None:
    con.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES"
                f" ({', '.join('?' for _ in row)})", list(row.values()))


def request(con, rid: str, finished: float, outcome: str = "finished", e2e: float = 1.0,
            run_id: str = "run1", **more) -> None:
    insert(con, "requests", run_id=run_id, request_id=rid, model="m", lane="interactive",
           tenant="t", outcome=outcome, finish_detail="", arrival_time=finished - e2e,
           finished_time=finished, e2e_s=e2e, **more)


def step(con, step_id: int, start: float, run_id: str = "run1", **more) -> None:
    insert(con, "steps", run_id=run_id, step_id=step_id, start_time=start,
           end_time=start + 0.1, duration_s=0.1, **more)


def test_a_window_keeps_both_its_ends_and_nothing_past_them(con):
    for i, finished in enumerate((10.0, 20.0, 30.0)):
        request(con, f"r{i}", finished)
    [row] = queries.latency(con, since=10.0, until=20.0, by="model")
    assert row["requests"] == 2
    outcomes = queries.summary(con, since=10.0, until=20.0)["outcomes"]
    assert [(o["outcome"], o["requests"]) for o in outcomes] == [("finished", 2)]


def test_a_window_whose_since_is_after_its_until_is_refused(con):
    """A 400 (exit 2 in the CLI) naming both ends, not an empty answer that reads as no
    traffic."""
    with pytest.raises(ValueError, match="is after until"):
        queries.latency(con, since=20.0, until=10.0)


def test_latency_percentiles_leave_rejections_out(con):
    """A rejection's e2e is 0: counted among the requests, never in a latency."""
    for i, e2e in enumerate((1.0, 2.0, 3.0)):
        request(con, f"ok{i}", 100.0 + i, e2e=e2e)
    for i in range(3):
        request(con, f"no{i}", 110.0 + i, outcome="rejected", e2e=0.0)
    [row] = queries.latency(con, by="model")
    assert (row["requests"], row["finished"], row["rejected"]) == (6, 3, 3)
    assert row["e2e_s_p50"] == pytest.approx(2.0)


def test_slow_names_the_step_sizes_it_waited_through_up_to_its_first_token(con):
    """Why a slow request's TTFT was long: the steps before its first token, not the
    decode steps after it."""
    request(con, "r", 10.0, e2e=10.0, first_token_time=2.0, ttft_s=2.0)
    step(con, 1, 0.5, step_reason="grow_for_throughput")
    step(con, 2, 1.5, step_reason="grow_for_throughput")
    step(con, 3, 5.0, step_reason="target")
    [row] = queries.slow(con)
    assert row["step_reasons"] == {"grow_for_throughput": 2}


def test_steps_around_a_moment_are_in_time_order(con):
    for i in range(1, 7):
        step(con, i, float(i))
    around = queries.steps_around(con, at=3.0, before=2, after=2)
    assert [s["step_id"] for s in around] == [2, 3, 4, 5]


def test_a_resent_request_id_shows_its_latest_request(con):
    """A request id used again (a client's retry in a later run) names the latest one."""
    request(con, "r", 10.0, run_id="run1")
    request(con, "r", 20.0, run_id="run2")
    timeline = queries.request_timeline(con, "r")
    assert timeline["request"]["run_id"] == "run2"
