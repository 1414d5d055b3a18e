"""`batchpilot trace --db 'DIR/replica-*.duckdb'`: a fleet's per-replica trace files read as
one. Two files written by the trace writer (the simulated workload of fixtures/trace_data,
runs "run-a" and "run-b"): the fleet's counts are the sum of the files', every row names
its replica, `--replica` reads one file, and the failures say what to do."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest
from fixtures.trace_data import fill_trace

from control.cli.main import main
from control.trace.fleet_db import open_parquet
from control.trace.sources import FileSource


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet")
    fill_trace(str(folder / "replica-0.duckdb"), run_id="run-a").stop()
    fill_trace(str(folder / "replica-1.duckdb"), run_id="run-b").stop()
    return folder


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["trace", *argv])
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ask_json(capsys, *argv: str):
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_fleets_counts_are_the_sum_of_its_files(fleet_dir, capsys):
    glob = str(fleet_dir / "replica-*.duckdb")
    fleet = ask_json(capsys, "--db", glob, "summary")
    files = [ask_json(capsys, "--db", str(fleet_dir / f"replica-{i}.duckdb"), "summary")
             for i in (0, 1)]
    for key in ("steps", "prefill_tokens", "decode_tokens", "preemptions"):
        assert fleet["steps"][key] == sum(f["steps"][key] for f in files), key
    requests = sum(o["requests"] for o in fleet["outcomes"])
    assert requests == sum(o["requests"] for f in files for o in f["outcomes"]) > 0
    assert fleet["latency"][0]["requests"] == requests
    assert [(r["run_id"], r["replica"]) for r in fleet["runs"]] == [("run-a", "0"),
                                                                     ("run-b", "1")]
    assert len(fleet["config_changes"]) == 2  # one per replica


def test_rows_name_their_replica_and_merge_in_order(fleet_dir, capsys):
    glob = str(fleet_dir / "replica-*.duckdb")
    slow = ask_json(capsys, "--db", glob, "slow", "--limit", "6", "--by", "ttft_s")
    assert {r["replica"] for r in slow} == {"0", "1"}
    ttft = [r["ttft_s"] for r in slow]
    assert ttft == sorted(ttft, reverse=True) and len(slow) == 6
    steps = ask_json(capsys, "--db", glob, "steps", "--since", "0", "--limit", "5000")
    one = ask_json(capsys, "--db", str(fleet_dir / "replica-0.duckdb"), "steps", "--since",
                   "0", "--limit", "5000")
    assert len(steps) == 2 * len(one)
    starts = [s["start_time"] for s in steps]
    assert starts == sorted(starts)
    at = one[10]["start_time"]
    around = ask_json(capsys, "--db", glob, "steps", "--at", str(at), "--before", "2",
                      "--after", "3")
    assert len(around) == 5 and sum(s["start_time"] <= at for s in around) == 2
    timeline = ask_json(capsys, "--db", glob, "request", "r3")
    assert timeline["replica"] in ("0", "1") and timeline["steps"]
    code, out, err = cli(capsys, "--db", glob, "request", "no-such-id", "--json")
    assert code == 1 and not out and "'no-such-id' is not in the trace" in err


def test_replica_reads_one_file(fleet_dir, capsys):
    glob = str(fleet_dir / "replica-*.duckdb")
    one = ask_json(capsys, "--db", glob, "--replica", "1", "summary")
    alone = ask_json(capsys, "--db", str(fleet_dir / "replica-1.duckdb"), "summary")
    assert one["steps"]["steps"] == alone["steps"]["steps"]
    assert [r["replica"] for r in one["runs"]] == ["1"]
    slow = ask_json(capsys, "--db", glob, "--replica", "1", "slow", "--limit", "50")
    assert slow and {r["replica"] for r in slow} == {"1"}
    code, _, err = cli(capsys, "--db", glob, "--replica", "5", "summary")
    assert code == 2 and "replica='5' must be one of 0, 1" in err
    # one file named with --replica: it must be that replica's, not read as if it were
    code, _, err = cli(capsys, "--db", str(fleet_dir / "replica-0.duckdb"), "--replica", "1",
                       "summary")
    assert code == 2 and "replica='1' must be one of 0" in err


def test_export_of_a_fleet_carries_the_replica_column(fleet_dir, capsys, tmp_path):
    glob = str(fleet_dir / "replica-*.duckdb")
    exported = ask_json(capsys, "--db", glob, "export", "--parquet", str(tmp_path))
    rows = {f["table"]: f["rows"] for f in exported["files"]}
    single = FileSource(str(fleet_dir / "replica-0.duckdb")).connect()
    try:
        assert rows["steps"] == 2 * single.execute("SELECT count(*) FROM steps").fetchone()[0]
    finally:
        single.close()
    con = duckdb.connect()
    replicas = con.execute(f"SELECT replica, count(*) FROM '{tmp_path}/requests.parquet'"
                           " GROUP BY 1 ORDER BY 1").fetchall()
    assert [r for r, _ in replicas] == ["0", "1"] and replicas[0][1] == replicas[1][1]


def test_failures_name_the_file_and_what_to_do(fleet_dir, capsys, tmp_path):
    code, _, err = cli(capsys, "--db", str(tmp_path / "nothing-*.duckdb"), "summary")
    assert code == 2 and "matches no file" in err
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(fleet_dir / "replica-0.duckdb", tmp_path / "a" / "replica-0.duckdb")
    shutil.copy(fleet_dir / "replica-0.duckdb", tmp_path / "b" / "replica-0.duckdb")
    code, _, err = cli(capsys, "--db", str(tmp_path / "*" / "replica-*.duckdb"), "summary")
    assert code == 2 and "are both replica '0'" in err
    held = tmp_path / "held"
    held.mkdir()
    shutil.copy(fleet_dir / "replica-1.duckdb", held / "replica-1.duckdb")
    writer = fill_trace(str(held / "replica-0.duckdb"), run_id="live")  # holds the file
    try:
        code, _, err = cli(capsys, "--db", str(held / "replica-*.duckdb"), "summary")
    finally:
        writer.stop()
    assert code == 2 and "replica-0.duckdb" in err and "--url" in err, err


def test_replicas_whose_columns_are_in_another_order_union_by_name(tmp_path):
    """A replica's table may hold its columns in another order (a trace from an older
    version gains its new columns at the end): each value stays under its own column."""
    def parquet(name: str, select: str) -> bytes:
        path = tmp_path / f"{name}.parquet"
        duckdb.connect().execute(f"COPY ({select}) TO '{path}' (FORMAT parquet)")
        return path.read_bytes()

    con = open_parquet({
        "0": {"requests": parquet("r0", "SELECT 'a' AS request_id, 1.0 AS ttft_s, 5.0 AS e2e_s")},
        "1": {"requests": parquet("r1", "SELECT 'b' AS request_id, 6.0 AS e2e_s,"
                                        " 2.0 AS ttft_s")}})
    try:
        rows = con.execute("SELECT request_id, ttft_s, e2e_s, replica FROM requests"
                           " ORDER BY request_id").fetchall()
    finally:
        con.close()
    assert rows == [("a", 1.0, 5.0, "0"), ("b", 2.0, 6.0, "1")]
