"""The go-live checklist from the command line: over a recorded trace (and a load test kept
in it or in a file of its own), its usage errors, and against a live tiny-model server
that fails until a rollback is exercised."""

from __future__ import annotations

import json
import time

import duckdb
import httpx
import pytest
from fixtures.serving import LiveServer, make_engine
from fixtures.trace_data import fill_trace

from control.checklist import (
    DEFAULT_SPEC,
    ChecklistError,
    ControlClient,
    LoadtestFile,
    evaluate,
    gather_evidence,
    load_spec,
)
from control.cli.main import main
from control.loadtest.metrics import summarize
from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.store import insert_rows, rows_for_api


def store_loadtest(path: str, run_id: str = "lt-1", sent: float = 1000.0,
                   itl_s: float = 0.02) -> None:
    """A load test with spread lengths, long prompts and a cancellation, into `path`; the
    server reported every TTFT 0.03 s and every E2E 0.01 s shorter than the client saw;
    its first request sent at `sent`, streams' chunks `itl_s` apart."""
    results = []
    for i in range(24):
        plan = PlannedRequest(index=i, arrival_s=0.1 * i, prompt_tokens=0, output_tokens=0,
                              tenant="acme", lane=None, stream=True,
                              cancel_after_s=0.5 if i == 3 else None)
        if i == 3:
            results.append(RequestResult(plan, "cancelled", 200, sent_at=sent + i))
            continue
        n = 8 + (i % 6) * 6
        chunks = [0.1 + itl_s * k for k in range(n)]
        results.append(RequestResult(plan, "ok", 200, sent_at=sent + i, ttft_s=0.1,
                                     e2e_s=chunks[-1], chunk_times_s=chunks,
                                     prompt_tokens=20 + 60 * (i % 12), output_tokens=n,
                                     server_ttft_s=0.07, server_e2e_s=chunks[-1] - 0.01))
    summary = summarize(results, 30.0, None, "")
    con = duckdb.connect(path)
    insert_rows(con, rows_for_api(run_id, "mixed", "", "http://x", summary, results))
    con.close()


@pytest.mark.parametrize("loadtest_db", [False, True], ids=["in-trace", "loadtest-db"])
def test_cli_on_a_recorded_trace(tmp_path, capsys, loadtest_db):
    db = str(tmp_path / "trace.duckdb")
    fill_trace(db).stop()
    results = str(tmp_path / "loadtest.duckdb") if loadtest_db else db
    store_loadtest(results)
    md = tmp_path / "go-live.md"
    extra = ["--loadtest-db", results] if loadtest_db else []
    code = main(["checklist", "--trace-db", db, "--json", "--markdown", str(md), *extra])
    out, err = capsys.readouterr()
    items = {i["id"]: i for i in json.loads(out)["items"]}
    assert code == 1, err  # no rollback in the trace
    assert items["rollback"]["status"] == "fail"
    assert items["tracing"]["status"] == "pass"
    # the trace recorded watermarks, budgets and the pool, not the queue limits
    assert items["watermarks"]["status"] == "pass"
    assert "not known: max_waiting_requests, queue_timeout_ms" in items["limits_set"]["evidence"]
    assert items["metrics"]["status"] == "needs-evidence"
    assert items["loadtest_run"]["status"] == "pass"
    assert items["real_lengths"]["status"] == "pass"
    assert "prompt tokens 20..680" in items["real_lengths"]["evidence"]
    assert items["latency_reconciled"]["status"] == "pass"
    assert ("TTFT gap p50 0.03 s, p99 0.03 s (23 requests) <= 0.1 s; E2E gap p50 0.01 s"
            in items["latency_reconciled"]["evidence"])
    assert items["long_prompts"]["status"] == "pass"  # 0.02 s between chunks
    assert "6 prompts of >= 512 tokens, 24 streamed" in items["long_prompts"]["evidence"]
    assert items["cancellation_frees_kv"]["status"] == "pass"
    assert "kv_blocks_used 0" in items["cancellation_frees_kv"]["evidence"]
    assert "## Rollout and rollback" in md.read_text()


def test_the_newest_load_test_is_the_one_judged(tmp_path):
    """Results are gathered newest first: a run whose streams stalled yesterday is not
    today's verdict, and "latest" names today's."""
    path = str(tmp_path / "loadtest.duckdb")
    store_loadtest(path, run_id="lt-old", sent=1000.0, itl_s=1.0)  # streams stalled then
    store_loadtest(path, run_id="lt-new", sent=90_000.0)
    ev = gather_evidence(None, loadtest_source=LoadtestFile(path))
    assert [r["run_id"] for r in ev.loadtest_runs] == ["lt-new", "lt-old"]
    assert [s["run_id"] for s in ev.loadtest_stats] == ["lt-new", "lt-old"]
    items = {r.id: r for r in evaluate(load_spec(DEFAULT_SPEC), ev)}
    assert "latest sized one: run lt-new" in items["loadtest_run"].evidence
    assert items["long_prompts"].status == "pass", items["long_prompts"].evidence
    assert "run lt-new" in items["long_prompts"].evidence


def test_cli_usage_errors_are_one_line(tmp_path, capsys):
    code = main(["checklist", "--trace-db", str(tmp_path / "missing.duckdb")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    code = main(["checklist", "--url", "http://127.0.0.1:9"])  # nothing listens on port 9
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the server at http://127.0.0.1:9" in err
    assert len(err.strip().splitlines()) == 1


# ---- end to end: a live server --------------------------------------------------------------
def test_live_server_fails_until_a_rollback_is_exercised(tiny_loaded, tmp_path, capsys):
    from control.serve.settings import ServeSettings

    settings = ServeSettings(model="tiny", trace_db=str(tmp_path / "trace.duckdb"))
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.02, settings=settings,
                                      max_num_seqs=4)
    with LiveServer(engine, settings) as url:
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={
                "model": "tiny", "prompt": "cancel me", "max_tokens": 200, "stream": True,
                "ignore_eos": True}) as reply:
            next(reply.iter_lines())  # one chunk, then the client goes away
        for _ in range(200):  # the server notices the disconnect and frees the request
            if 'outcome="cancelled"' in httpx.get(url + "/metrics").text:
                break
            time.sleep(0.05)
        code = main(["checklist", "--url", url, "--json"])
        items = {i["id"]: i for i in json.loads(capsys.readouterr().out)["items"]}
        assert code == 1
        assert items["rollback"]["status"] == "fail"
        assert "sources: startup" in items["rollback"]["evidence"]
        assert items["metrics"]["status"] == "pass", items["metrics"]["evidence"]
        assert "fleet ingress series not asked" in items["metrics"]["evidence"]
        assert items["tracing"]["status"] == "pass"
        assert items["watermarks"]["status"] == "pass"  # from the live config
        assert items["cancellation_frees_kv"]["status"] == "pass", \
            items["cancellation_frees_kv"]["evidence"]
        assert items["loadtest_run"]["status"] == "fail"  # the trace has none
        assert main(["ctl", "--url", url, "set", "max_num_seqs=2", "--reason", "x"]) == 0
        assert main(["ctl", "--url", url, "rollback", "1", "--reason", "drill"]) == 0
        capsys.readouterr()
        code = main(["checklist", "--url", url])
        out = capsys.readouterr().out
        assert code == 1  # the load test is still missing
        rollback = next(line for line in out.splitlines() if "version 3 (rollback:1)" in line)
        assert "reason 'drill'" in rollback
    engine.stop()
    # afterwards, from the trace file alone: the server ran on the built-in defaults with
    # the test's engine overrides, which (with the trace) tell most of the config
    code = main(["checklist", "--trace-db", settings.trace_db, "--json"])
    items = {i["id"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    assert code == 1
    assert items["rollback"]["status"] == "pass"
    assert "[trace config_changes]" in items["rollback"]["evidence"]
    assert items["limits_set"]["status"] == "fail"  # the default batch lane is uncapped
    assert "lanes.batch.max_running unset" in items["limits_set"]["evidence"]
    # the budgets the server fitted to its device are in the run's settings
    assert items["chunked_prefill"]["status"] == "pass", items["chunked_prefill"]["evidence"]
    assert "prefill_chunk_size" in items["chunked_prefill"]["evidence"]
    assert items["metrics"]["status"] == "needs-evidence"


def test_a_refused_token_is_a_usage_error_with_a_hint(monkeypatch):
    monkeypatch.delenv("CHECKLIST_TEST_TOKEN", raising=False)
    failure = ControlClient("http://x", "CHECKLIST_TEST_TOKEN")._failure(401, "no token", "/p")
    assert isinstance(failure, ChecklistError) and failure.code == 2
    assert "$CHECKLIST_TEST_TOKEN is not set" in str(failure)



def test_strict_fails_a_checklist_that_needs_evidence(tmp_path, capsys):
    """Nothing fails, one item needs evidence: exit 0, and 1 with --strict (a pipeline's
    gate on a checklist it could not decide)."""
    db = str(tmp_path / "trace.duckdb")
    fill_trace(db).stop()
    spec = tmp_path / "spec.yaml"
    spec.write_text("sections:\n  - id: s\n    title: S\n    items:\n      - id: metrics\n"
                    "        title: metrics\n        why: boards\n        check: metrics_present\n")
    assert main(["checklist", "--trace-db", db, "--spec", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"][0]["status"] == "needs-evidence"
    assert main(["checklist", "--trace-db", db, "--spec", str(spec), "--strict"]) == 1


def test_checklist_replica_reaches_the_control_client(monkeypatch, capsys):
    """--replica narrows the live config and /metrics too, not only the trace."""
    import control.checklist

    made = []

    class Recording(ControlClient):
        def __init__(self, url, token_env, replica=None):
            made.append(replica)
            raise ChecklistError("stop here")

    monkeypatch.setattr(control.checklist, "ControlClient", Recording)
    assert main(["checklist", "--url", "http://127.0.0.1:9", "--replica", "1"]) == 2
    assert made == ["1"] and "stop here" in capsys.readouterr().err
