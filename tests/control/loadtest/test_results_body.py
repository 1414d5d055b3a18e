"""POST /v1/loadtest/results's body (control/loadtest/results_body.py): the load tester's
split of a long run into bodies the server takes, and the server's check of a body before
it writes anything."""

from __future__ import annotations

import duckdb
import pytest

from control.loadtest.metrics import summarize
from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.results_body import (
    MAX_ROWS,
    MAX_RUNS,
    ResultsBodyError,
    bodies_for_api,
    checked_runs,
)
from control.loadtest.store import REQUESTS_TABLE, RUNS_TABLE, insert_runs, rows_for_api
from control.trace.facts import loadtest_stats


def run_rows(label: str, n: int) -> dict[str, list[dict]]:
    results = [RequestResult(PlannedRequest(index=i, arrival_s=0.0, prompt_tokens=8,
                                            output_tokens=4, tenant="acme", lane=None,
                                            stream=True, cancel_after_s=None),
                             "ok", 200, sent_at=1000.0 + i, ttft_s=0.1, e2e_s=0.5,
                             chunk_times_s=[0.1, 0.5], prompt_tokens=8, output_tokens=2)
               for i in range(n)]
    return rows_for_api("run-1", "tiny", label, "http://x", summarize(results, 1.0, None,
                                                                        label), results)


def test_a_run_that_fits_goes_in_one_body_as_before():
    runs = [run_rows("a", 3), run_rows("b", 4)]
    assert bodies_for_api(runs, max_rows=100) == [{"runs": runs}]


def test_a_long_run_sends_its_requests_first_and_its_run_rows_last(tmp_path):
    runs = [run_rows("a", 25), run_rows("b", 7)]
    bodies = bodies_for_api(runs, max_rows=10)
    assert [sum(len(rows) for run in b["runs"] for rows in run.values()) for b in bodies] \
        == [10, 10, 5, 7, 2]
    *requests, last = bodies
    assert all(set(run) == {REQUESTS_TABLE} for b in requests for run in b["runs"])
    assert [set(run) for run in last["runs"]] == [{RUNS_TABLE}, {RUNS_TABLE}]
    # stored body by body, the tables hold what one insert of everything holds
    split, whole = (duckdb.connect(str(tmp_path / f"{n}.duckdb")) for n in ("split", "whole"))
    for body in bodies:
        insert_runs(split, checked_runs(body))
    insert_runs(whole, runs)
    for table in (RUNS_TABLE, REQUESTS_TABLE):
        query = f'SELECT * FROM {table} ORDER BY label, "index"' if table == REQUESTS_TABLE \
            else f"SELECT * FROM {table} ORDER BY label"
        assert split.execute(query).fetchall() == whole.execute(query).fetchall()
    assert split.execute(f"SELECT count(*) FROM {REQUESTS_TABLE}").fetchone()[0] == 32


def test_requests_of_a_save_that_stopped_half_way_are_not_counted(tmp_path):
    """Its run row never came (it is sent last): the stats count only listed runs."""
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    first, *_ = bodies_for_api([run_rows("half", 25)], max_rows=10)
    insert_runs(con, checked_runs(first))
    assert loadtest_stats(con) == []
    insert_runs(con, [run_rows("whole", 3)])
    assert [(r["label"], r["requests"]) for r in loadtest_stats(con)] == [("whole", 3)]


def test_many_configs_are_split_by_count_too():
    runs = [run_rows(f"c{i}", 1) for i in range(MAX_RUNS + 5)]
    bodies = bodies_for_api(runs, max_rows=10_000)
    assert all(len(b["runs"]) <= MAX_RUNS for b in bodies)
    for body in bodies:
        checked_runs(body)


ROW = {"run_id": "r"}


@pytest.mark.parametrize(("body", "says"), [
    ({"runs": []}, 'must be {"runs"'),
    ({"runs": "x"}, 'must be {"runs"'),
    ({"runs": [{}] * 100_000}, f"runs holds 100,000 entries; at most {MAX_RUNS}"),
    ({"runs": [{REQUESTS_TABLE: [ROW]}], "extra": 1}, "unknown field 'extra'"),
    ({"runs": [{}]}, "runs[0] must be an object of tables"),
    ({"runs": [[1]]}, "runs[0] must be an object of tables"),
    ({"runs": [{"nope": [ROW]}]}, "runs[0]: unknown table 'nope'"),
    ({"runs": [{REQUESTS_TABLE: {"a": 1}}]}, f"runs[0].{REQUESTS_TABLE} must be a list"),
    ({"runs": [{REQUESTS_TABLE: [ROW, 5]}]}, f"runs[0].{REQUESTS_TABLE}[1] must be an"),
    ({"runs": [{RUNS_TABLE: [{**ROW, "colour": 1}]}]}, "unknown column 'colour'"),
    ({"runs": [{RUNS_TABLE: [{"label": "x"}]}]}, "run_id must be a non-empty string"),
    ({"runs": [{REQUESTS_TABLE: [ROW] * (MAX_ROWS + 1)}]}, f"more than {MAX_ROWS:,} rows"),
], ids=["empty", "not-a-list", "100k-entries", "extra-field", "empty-run", "run-not-object",
        "unknown-table", "rows-not-list", "row-not-object", "unknown-column", "no-run-id",
        "too-many-rows"])
def test_a_bad_body_is_named_before_anything_is_written(body, says):
    with pytest.raises(ResultsBodyError) as exc:
        checked_runs(body)
    assert says in str(exc.value)
