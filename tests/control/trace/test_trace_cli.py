"""`batchpilot trace`: the same answers from a trace file (--db) and a server (--url).

The traces come from the simulated executor on a fake clock (no model): 8 requests on a
40-block KV pool, so some are preempted; one is cancelled while queued, one rejected as
too long, and one live config change. Both files are filled the same way, so everything
but wall-clock figures (step durations, run start) agrees between them.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest
import uvicorn
from fixtures.trace_data import fill_trace, trace_routes_app

from control.cli.main import main
from control.trace.audit_sources import NOT_VERSION_PREFIXES, NOT_VERSIONS
from control.trace.schema import TABLES

DOCS = Path(__file__).resolve().parents[3] / "docs" / "traces.md"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("trace") / "trace.duckdb")
    fill_trace(path).stop()
    return path


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """The real trace routes over a second trace, held by a started writer, in uvicorn."""
    writer = fill_trace(str(tmp_path_factory.mktemp("served") / "trace.duckdb"))
    app = trace_routes_app(writer)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    writer.stop()


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["trace", *argv])
    except SystemExit as done:  # argparse's usage errors
        code = done.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def query(db: str, sql: str) -> list[tuple]:
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def shown(seconds: float) -> str:
    """How the CLI prints a duration (ms below a second)."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


# ---- text output -----------------------------------------------------------------------
def test_summary_names_throughput_outcomes_waits_and_config_changes(db, capsys):
    code, out, _ = cli(capsys, "--db", db, "summary")
    assert code == 0
    [(steps, preemptions)] = query(db, "SELECT count(*), sum(len(preempted)) FROM steps")
    assert f"steps        {steps}, " in out and "tokens/s" in out
    assert f"preemptions  {preemptions}" in out and preemptions > 0
    assert re.search(r"finished\s+-\s+7\n", out)
    assert re.search(r"rejected\s+too_long\s+1\n", out)
    assert re.search(r"cancelled\s+-\s+1\n", out)
    assert re.search(r"max_num_seqs\s+\d+\s+", out)  # a wait reason with its count
    assert '{"max_num_seqs": [4, 3]}' in out and "tester" in out
    for name in ("ttft", "tpot", "e2e", "queue"):
        assert re.search(rf"\n  {name}\s+\S+ m?s\s+\S+ m?s\s+\S+ m?s\n", out), name


def test_slow_lists_the_slowest_first_with_figures_from_the_requests_table(db, capsys):
    code, out, _ = cli(capsys, "--db", db, "slow", "--limit", "3")
    assert code == 0
    expected = query(db, "SELECT request_id, queue_delay_s, prefill_time_s, decode_time_s,"
                     " preempted_s FROM requests ORDER BY e2e_s DESC LIMIT 3")
    lines = out.splitlines()[2:5]  # title, header, then the rows
    for line, (rid, queue, prefill, decode, preempted) in zip(lines, expected, strict=True):
        assert line.split()[0] == rid
        for seconds in (queue, prefill, decode, preempted):
            assert (shown(seconds) if seconds else " 0 ") in line, (line, seconds)
    assert "max_num_seqs" in lines[0]  # the slowest waited mostly for a sequence slot


def test_slow_rows_from_a_fleet_name_their_replica():
    """A fleet's ingress adds `replica` to each row it gathers (docs/fleet.md): the table
    shows it; a single server's rows have none and no column."""
    from control.trace.format import slow

    row = {"request_id": "r1", "e2e_s": 1.0, "queue_s": 0.5, "prefill_s": 0.1,
           "decode_s": 0.4, "preempted_s": 0.0, "wait_reasons": {"max_num_seqs": 0.5},
           "step_reasons": None, "outcome": "finished", "finish_reason": "length",
           "lane": "interactive", "tenant": "acme"}
    fleet = slow([{**row, "replica": "1"}, {**row, "request_id": "r2", "replica": "0"}])
    header, first, second = fleet.splitlines()[1:4]
    assert header.split()[-1] == "replica"
    assert first.split()[-1] == "1" and second.split()[-1] == "0"
    assert "replica" not in slow([row])


def test_step_rows_from_a_fleet_name_their_replica(db):
    from control.trace.format import steps
    from control.trace.sources import FileSource

    rows = FileSource(db).ask("steps", since=None, until=None, limit=2, batch=False)
    assert rows and "replica" not in steps(rows)
    fleet = steps([{**rows[0], "replica": "1"}, {**rows[1], "replica": "0"}])
    header, first, second = fleet.splitlines()[:3]
    assert header.split()[-1] == "replica" and first.split()[-1] == "1"
    assert second.split()[-1] == "0"


def test_request_shows_breakdown_events_in_order_and_the_steps_it_ran_in(db, capsys):
    [(rid, lane, tenant)] = query(db, "SELECT request_id, lane, tenant FROM requests WHERE"
                                  " num_preemptions > 0 ORDER BY e2e_s DESC LIMIT 1")
    code, out, _ = cli(capsys, "--db", db, "request", rid)
    assert code == 0
    assert f"request {rid}" in out and f"lane {lane}, tenant {tenant}" in out
    assert "preemptions 1" in out and re.search(r"preempted in step \d+", out)
    events = re.findall(r"^ +\+\S+(?: m?s)? +\d\d:\d\d:\d\d\.\d{3} +(\w[\w ]*?)(?: {2}|$)",
                        out, re.M)
    assert events[:2] == ["arrival", "admitted"] and events[-1] == "finished"
    assert events.index("first_scheduled") < events.index("first_token")
    assert "queue wait ended" in events and "requeue wait ended" in events
    (n_prefill, prefill_tokens), = query(
        db, f"SELECT count(*), sum(tokens) FROM step_requests WHERE request_id = '{rid}'"
        " AND phase = 'prefill'")
    [(n_decode,)] = query(db, f"SELECT count(*) FROM step_requests WHERE request_id ="
                          f" '{rid}' AND phase = 'decode'")
    assert f"prefill: {n_prefill} steps, {prefill_tokens} tokens (steps " in out
    assert f"decode: {n_decode} steps (steps " in out


def test_steps_around_a_moment_and_in_a_window(db, capsys):
    [(at,)] = query(db, "SELECT start_time + 0.001 FROM steps WHERE step_id = 50")
    code, out, _ = cli(capsys, "--db", db, "steps", "--at", str(at), "--before", "2",
                       "--after", "3", "--batch")
    assert code == 0
    ids = [int(m) for m in re.findall(r"^  \d\d:\d\d:\d\d\.\d{3}\s+(\d+)\s", out, re.M)]
    assert ids == [49, 50, 51, 52, 53]
    assert out.index(" 50 ") < out.index("----") < out.index(" 51 ")  # the moment
    assert "decode  r" in out  # --batch: which requests ran
    [(lo,)] = query(db, "SELECT min(start_time) FROM steps")
    hi = lo + 0.035  # steps are 10 ms apart on the fake clock
    [(n,)] = query(db, f"SELECT count(*) FROM steps WHERE start_time BETWEEN {lo} AND {hi}")
    code, out, _ = cli(capsys, "--db", db, "steps", "--since", str(lo), "--until", str(hi))
    assert code == 0
    assert len(re.findall(r"^  \d\d:\d\d:\d\d\.\d{3}", out, re.M)) == n == 4
    assert "token_budget:" in out  # waiting by reason


# ---- the same answers from a file and from a server ------------------------------------
WALL_CLOCK = ("step_s_mean", "step_s_p99")  # perf_counter durations: differ run to run


@pytest.mark.parametrize("argv", [["summary"], ["slow", "--limit", "4", "--by", "ttft_s"],
                                  ["request", "r7"], ["request", "big"]])
def test_db_and_url_give_the_same_json(db, url, capsys, argv):
    answers = []
    for source in (["--db", db], ["--url", url]):
        code, out, err = cli(capsys, *source, *argv, "--json")
        assert code == 0, err
        answers.append(json.loads(out))
    if argv[0] == "summary":
        for answer in answers:
            for key in WALL_CLOCK:
                answer["steps"].pop(key)
            for run in answer["runs"]:
                run.pop("started")
    assert answers[0] == answers[1]


def test_the_text_from_a_server_is_the_text_from_the_file(db, url, capsys, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_URL", url)  # the default for --url
    for argv in (["request", "r6"], ["slow"], ["steps", "--since", "0", "--limit", "30"]):
        texts = [cli(capsys, "--db", db, *argv)[1], cli(capsys, *argv)[1]]
        if argv[0] == "steps":  # step durations are wall-clock: drop that column
            texts = [" ".join(re.sub(r" \d+ us | [\d.]+ ms ", " ", t).split()) for t in texts]
        assert texts[0] == texts[1] and texts[0]


@pytest.mark.parametrize("argv", [["steps", "--at", "0"], ["steps", "--since", "0", "--batch"],
                                  ["export", "--parquet", "PQ"]])
def test_json_of_the_other_subcommands_parses(db, capsys, tmp_path, argv):
    argv = [str(tmp_path / "pq") if a == "PQ" else a for a in argv]
    code, out, _ = cli(capsys, "--db", db, *argv, "--json")
    assert code == 0
    assert json.loads(out)


# ---- errors ----------------------------------------------------------------------------
def test_an_unknown_request_exits_1_from_either_source(db, url, capsys):
    # 'r1#x' and 'r1?x=1' are ids of their own, not r1 with a fragment or a query
    for rid, source in itertools.product(("no-such-id", "r1#x", "r1?x=1"),
                                         (["--db", db], ["--url", url])):
        code, out, err = cli(capsys, *source, "request", rid)
        assert code == 1 and not out
        assert f"{rid!r} is not in the trace" in err


def test_bad_values_are_usage_errors_naming_what_is_wrong(db, url, capsys):
    code, _, err = cli(capsys, "--db", db, "summary", "--since", "yesterday-ish")
    assert code == 2 and "--since" in err and "'yesterday-ish' is not understood" in err
    for source in (["--db", db], ["--url", url]):  # the queries' own message, both ways
        code, _, err = cli(capsys, *source, "slow", "--limit", "0")
        assert code == 2 and "limit=0 must be in 1..5000" in err
    code, _, err = cli(capsys, "--db", db, "steps")
    assert code == 2 and "--at" in err
    for source in (["--db", db], ["--url", url]):
        code, _, err = cli(capsys, *source, "slow", "--since", "-1m", "--until", "-2m")
        assert code == 2 and "since=" in err and "is after until=" in err, err
        assert "the window is empty" in err


def test_steps_at_a_moment_with_either_end_of_a_window_is_a_usage_error(db, capsys):
    """--at T picks the steps around T: with --since or --until as well, which one counts
    is not said, so neither is guessed."""
    for extra in (["--since", "5"], ["--until", "5"], ["--since", "1", "--until", "5"]):
        code, out, err = cli(capsys, "--db", db, "steps", "--at", "10", *extra)
        assert code == 2 and not out and "not both" in err, extra


def test_no_time_and_no_limit_out_of_range_reaches_a_query(url):
    for path, params, named in (
            ("/v1/trace/summary", {"since": "nan"}, "not a finite number"),
            ("/v1/trace/slow", {"until": "inf"}, "not a finite number"),
            ("/v1/trace/steps", {"since": "1e400"}, "not a finite number"),
            ("/v1/loadtest/runs", {"limit": "-1"}, "limit=-1 must be in 1..1000"),
            ("/v1/loadtest/stats", {"limit": "0"}, "limit=0 must be in 1..1000"),
            # a window that ends before it starts: empty, so refused, not answered []
            ("/v1/trace/kv", {"since": "now", "until": "-1d"}, "is after until="),
            ("/v1/trace/summary", {"since": "-1m", "until": "-2m"}, "the window is empty")):
        reply = httpx.get(url + path, params=params, timeout=30)
        assert reply.status_code == 400, (path, reply.text)
        assert named in reply.json()["error"]["message"], (path, reply.text)
        if "until" in params and "since" in params:
            assert reply.json()["error"]["param"] == "since", reply.text
    assert httpx.get(url + "/v1/loadtest/runs", params={"limit": 5}).status_code == 200


def test_the_source_must_be_exactly_one_of_db_or_url(db, capsys, monkeypatch):
    monkeypatch.delenv("BATCHPILOT_URL", raising=False)
    code, _, err = cli(capsys, "summary")
    assert code == 2 and "--db FILE" in err and "--url URL" in err
    code, _, err = cli(capsys, "--db", db, "--url", "http://127.0.0.1:1", "summary")
    assert code == 2 and "not both" in err
    code, _, err = cli(capsys, "summary", "--db", db + ".missing")  # after the subcommand
    assert code == 2 and "does not exist" in err


def test_a_duckdb_file_that_is_not_a_trace_is_a_usage_error_naming_its_tables(capsys,
                                                                            tmp_path):
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE steps (x INTEGER)")
    con.close()
    code, out, err = cli(capsys, "--db", str(other), "summary")
    assert code == 2 and not out
    assert "is not a batchpilot trace (missing tables: requests, kv_snapshots" in err, err


def test_a_server_that_cannot_be_reached_exits_1_naming_the_url(capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = cli(capsys, "--url", f"http://127.0.0.1:{port}", "summary")
    assert code == 1 and f"cannot reach the server at http://127.0.0.1:{port}" in err


def test_a_file_held_by_another_process_gets_the_friendly_message(db, capsys, tmp_path):
    held = tmp_path / "held.duckdb"
    held.write_bytes(Path(db).read_bytes())
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]);"
         " print('ready', flush=True); time.sleep(60)", str(held)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        code, _, err = cli(capsys, "--db", str(held), "summary")
    finally:
        holder.kill()
        holder.wait(10)
    assert code == 2
    assert "held by another process" in err and "--url" in err


# ---- export ----------------------------------------------------------------------------
def test_export_writes_one_parquet_file_per_table_with_all_rows(db, capsys, tmp_path):
    folder = tmp_path / "out" / "postmortem"  # created, parents too
    code, out, _ = cli(capsys, "--db", db, "export", "--parquet", str(folder))
    assert code == 0
    names = [*TABLES, "step_requests"]
    for name in names:
        path = folder / f"{name}.parquet"
        [(rows,)] = query(db, f"SELECT count(*) FROM {name}")
        [(read_back,)] = duckdb.sql(f"SELECT count(*) FROM read_parquet('{path}')").fetchall()
        assert read_back == rows
        assert re.search(rf"{re.escape(str(path))}\s+{rows}\n", out)
    assert sorted(p.stem for p in folder.iterdir()) == sorted(names)


def test_export_refuses_a_server_and_a_quote_in_the_path(db, url, capsys, tmp_path):
    code, _, err = cli(capsys, "--url", url, "export", "--parquet", str(tmp_path))
    assert code == 2 and "export needs the trace file" in err and ".wal" in err
    code, _, err = cli(capsys, "--db", db, "export", "--parquet", str(tmp_path / "it's"))
    assert code == 2 and "single quote" in err
    assert not (tmp_path / "it's").exists()


# ---- what docs/traces.md says ----------------------------------------------------------
def test_every_sql_example_in_the_docs_runs(db):
    blocks = re.findall(r"```sql\n(.*?)```", DOCS.read_text(), re.S)
    assert 6 <= len(blocks) <= 10
    for sql in blocks:
        query(db, sql)  # raises on an error


def test_the_docs_steps_per_config_version_count_each_step_once(db, tmp_path):
    """Audit rows (a what-if asked, a drain) share config_changes with the version they
    were made under; the docs' per-version query must not count a step once per row."""
    copy = tmp_path / "trace.duckdb"
    copy.write_bytes(Path(db).read_bytes())
    con = duckdb.connect(str(copy))
    run_id, version = con.execute("SELECT run_id, config_version FROM steps LIMIT 1").fetchone()
    # every audit source there is: one added to the code must be added to the docs' query
    for source in (*NOT_VERSIONS, *(p + "x" for p in NOT_VERSION_PREFIXES)):
        con.execute("INSERT INTO config_changes VALUES (?, 0, ?, ?, 'x', '{}', '')",
                    [run_id, version, source])
    con.close()
    sql = next(b for b in re.findall(r"```sql\n(.*?)```", DOCS.read_text(), re.S)
               if "tokens_per_s" in b)
    got = {(r[0], r[1]): r[4] for r in query(str(copy), sql)}
    steps = query(str(copy), "SELECT run_id, config_version, count(*) FROM steps GROUP BY ALL")
    assert got == {(r, v): n for r, v, n in steps}


def test_step_requests_tokens_add_up_as_the_docs_say(db):
    rows = query(db, """
        SELECT r.request_id, r.num_preemptions, sum(s.tokens),
               r.num_prompt_tokens - r.num_cached_tokens + r.num_output_tokens - 1
        FROM requests r JOIN step_requests s USING (run_id, request_id)
        GROUP BY ALL""")
    assert len(rows) == 7
    for rid, preemptions, ran, expected in rows:
        assert ran == expected if preemptions == 0 else ran > expected, rid


def test_the_docs_describe_every_table_and_column():
    text = DOCS.read_text()
    missing = [f"{t.name}.{c}" for t in TABLES.values() for c in (t.name, *t.column_names)
               if f"`{c}`" not in text]
    assert not missing, f"docs/traces.md does not mention {missing}"


def test_relative_times_may_follow_their_option_as_a_separate_word():
    from control.cli.main import relative_times

    assert relative_times(["trace", "summary", "--since", "-15m", "--until", "-1.5h"]) == [
        "trace", "summary", "--since=-15m", "--until=-1.5h"]
    assert relative_times(["trace", "steps", "--at", "-30", "--before", "3"]) == [
        "trace", "steps", "--at=-30", "--before", "3"]
    assert relative_times(["ctl", "set", "--json", "-v"]) == ["ctl", "set", "--json", "-v"]
