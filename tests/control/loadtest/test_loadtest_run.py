"""The load tester against a live server (tiny model): what it measures, cancellations
that really close connections, A/B through the control API, results in the trace DB."""

from __future__ import annotations

import asyncio

import duckdb
import pytest
from fixtures.serving import LiveServer, make_engine
from prometheus_client.parser import text_string_to_metric_families

from control.cli.main import main
from control.loadtest.records import PlannedRequest
from control.loadtest.runner import run


def planned(n: int, *, cancel_every: int = 0, stream_every: int = 1) -> list[PlannedRequest]:
    return [PlannedRequest(
        index=i, arrival_s=0.02 * i, prompt_tokens=8, output_tokens=24,
        tenant="acme" if i % 2 else "beta", lane="batch" if i % 3 == 0 else None,
        stream=i % stream_every == 0,
        cancel_after_s=0.15 if cancel_every and i % cancel_every == 0 else None)
        for i in range(n)]


@pytest.fixture(scope="module")
def server(tiny_loaded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loadtest")
    from control.serve.settings import ServeSettings

    settings = ServeSettings(model="tiny", trace_db=str(tmp / "trace.duckdb"))
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.02, settings=settings,
                                      max_num_seqs=4)
    live = LiveServer(engine, settings)
    with live as url:
        yield url, engine, live.app


def cancelled_on_server(url: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "batchpilot_requests_total"
               and s.labels.get("outcome") == "cancelled")


@pytest.mark.parametrize("local", [True, False], ids=["sse_transport", "httpx"])
def test_streams_cancellations_and_timing(server, local):
    """The same through both transports: sse_transport (a server on this machine, the
    default here) and httpx (the default for other machines)."""
    url, _, _ = server
    before = cancelled_on_server(url)
    plan = planned(12, cancel_every=4, stream_every=2)
    prompts = {p.index: f"load test prompt {p.index}" for p in plan}
    results, duration = asyncio.run(run(url, plan, prompts, model="tiny", concurrency=6,
                                        local=local))
    assert duration > 0
    # the run lasts from its first send to its last end (the sends are 0.02 s apart)
    first = min(r.sent_at for r in results)
    assert all(r.sent_at - first + r.e2e_s <= duration + 1e-6 for r in results)
    by_outcome = {r.planned.index: r.outcome for r in results}
    cancelled = [i for i, o in by_outcome.items() if o == "cancelled"]
    assert cancelled == [0, 4, 8]  # 24 tokens at 20 ms a step take longer than 0.15 s
    for r in results:
        if r.outcome != "ok":
            continue
        assert r.output_tokens == 24 and r.e2e_s >= r.ttft_s > 0
        assert r.request_id and r.server_e2e_s is not None and r.server_lane
        if r.planned.stream:
            # a chunk per token that decodes to text (the random tiny model's often don't)
            assert len(r.chunk_times_s) <= 24
            assert r.chunk_times_s == sorted(r.chunk_times_s)
    # the server saw the client leave: one cancelled request per closed connection
    deadline = asyncio.run(_wait_for(lambda: cancelled_on_server(url) - before == 3))
    assert deadline


def test_each_lane_is_judged_by_the_slo_its_responses_carried(server):
    """The lane and SLO each response carried group the summary (by_server_lane), and the
    go-live checklist judges each lane by its own SLO: a lane without one is named, not
    judged; a target the spec sets for every lane overrides the lane's."""
    from dataclasses import asdict

    from control.checklist.checks_loadtest import latency_under_slo
    from control.checklist.evidence import Evidence
    from control.checklist.registry import CHECKS
    from control.loadtest.metrics import summarize

    url, engine, _ = server
    plan = planned(9)
    prompts = {p.index: f"lane prompt {p.index}" for p in plan}
    results, duration = asyncio.run(run(url, plan, prompts, model="tiny", concurrency=3))
    summary = summarize(results, duration, None)
    live = engine.live_config
    targets = {lane.name: live.lane_slo(lane) for lane in live.lanes}
    assert sorted(summary.by_server_lane) == ["batch", "interactive"]  # None: interactive
    for lane, group in summary.by_server_lane.items():
        slo = targets[lane]
        assert group.slo == ({"by_lane": {lane: {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s,
                                                 "e2e_s": None}}} if slo.is_set else None)
    assert targets["interactive"].ttft_s and not targets["batch"].is_set
    ev = Evidence(loadtest_runs=[{"run_id": "r", "label": "", "scenario": "s",
                                  "requests": 9, "summary": asdict(summary)}])
    params = dict(CHECKS["latency_under_slo"].defaults, min_requests=9)
    verdict = latency_under_slo(ev, params)
    assert verdict.status == "pass", verdict.evidence
    assert "interactive ttft p99" in verdict.evidence
    assert "(no SLO, not judged: lane batch)" in verdict.evidence
    # a scenario's own SLO (here one nobody meets) does not replace the lanes'
    from control.loadtest.records import SLO

    scenario_slo = summarize(results, duration, SLO(ttft_s=1e-6))
    ev.loadtest_runs[0]["summary"] = asdict(scenario_slo)
    assert scenario_slo.goodput_rps == 0
    assert latency_under_slo(ev, params).status == "pass"
    strict = latency_under_slo(ev, {**params, "ttft_s": 1e-6})  # for every lane
    assert strict.status == "fail"
    assert "lane batch ttft p95" in strict.evidence and "> 1e-06 s" in strict.evidence


async def _wait_for(condition, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


def test_loadtest_cli_compares_configs_and_stores_results(server, tmp_path, capsys):
    url, engine, _ = server
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(
        "name: tiny\ndescription: a few short requests\nseed: 1\nrequests: 6\n"
        "concurrency: 4\narrival: {process: poisson, rate: 20}\n"
        "prompt: {dist: uniform, min: 4, max: 12}\noutput: {dist: fixed, value: 6}\n"
        "stream_ratio: 1.0\nslo: {ttft_s: 5.0}\n")
    version = engine.live_config.version
    code = main(["loadtest", "--scenario", str(scenario), "--url", url, "--tokenizer",
                 str(engine.parts.frontend_tokenizer.name_or_path), "--compare",
                 "continuous:batching=continuous", "--compare", "static:batching=static",
                 "--out", str(tmp_path / "out"), "--db", str(tmp_path / "lt.duckdb"),
                 "--rate", "30"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "continuous" in out and "static" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("static") >= 1
    # the description states the scenario's own rate: the report says what was sent
    assert "- arrival rate: 30 requests/s on average (--rate)" in report
    # what the load generator's own CPU was, beside the server on this machine
    assert "load generator: " in err and "- load generator: " in report
    assert (tmp_path / "out" / "percentiles.png").read_bytes()[:4] == b"\x89PNG"
    con = duckdb.connect(str(tmp_path / "lt.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM loadtest_runs").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM loadtest_requests").fetchone()[0] == 12
    con.close()
    # the configs went through the control API and the original was restored
    assert engine.live_config.version == version + 2  # static, then the restore (continuous
    # was already in force: a change that changes nothing installs no version)
    assert engine.live_config.batching == "continuous"


def test_results_can_be_stored_in_the_servers_trace_db(server, capsys):
    import httpx

    from control.loadtest.metrics import summarize
    from control.loadtest.records import RequestResult
    from control.loadtest.store import rows_for_api

    url, _, app = server
    results = [RequestResult(p, "ok", 200, sent_at=1000.0 + p.index, ttft_s=0.1, e2e_s=0.5,
                             chunk_times_s=[0.1, 0.3, 0.5], prompt_tokens=8, output_tokens=3)
               for p in planned(3)]
    rows = rows_for_api("run-x", "tiny", "cfg", url, summarize(results, 3.0, None, "cfg"),
                        results)
    reply = httpx.post(url + "/v1/loadtest/results", json={"runs": [rows]})
    assert reply.status_code == 200 and reply.json() == {
        "stored_runs": 1, "stored_rows": {"loadtest_runs": 1, "loadtest_requests": 3}}
    bad = httpx.post(url + "/v1/loadtest/results", json={"runs": [{"nope": [{"a": 1}]}]})
    assert bad.status_code == 400 and "unknown table 'nope'" in bad.json()["error"]["message"]
    con = app.state.serving.trace.cursor()
    assert con.execute("SELECT count(*) FROM loadtest_requests WHERE run_id = 'run-x'"
                       ).fetchone()[0] == 3
    con.close()


def test_a_long_run_is_saved_to_the_server_in_bodies_it_takes(server, capsys):
    """9,000 requests are ~4.4 MB of rows, past the server's 4 MiB body limit: one body was
    a 413 and nothing saved. The load tester sends them in bodies, its run row last."""
    from argparse import Namespace

    from control.cli.ctl import Client
    from control.loadtest.cli import _store
    from control.loadtest.metrics import summarize
    from control.loadtest.records import RequestResult

    url, _, app = server
    results = [RequestResult(p, "ok", 200, sent_at=1000.0 + p.index, ttft_s=0.1, e2e_s=0.5,
                             chunk_times_s=[0.1, 0.3, 0.5], prompt_tokens=8, output_tokens=3)
               for p in planned(9000)]
    saved = [("long", summarize(results, 90.0, None, "long"), results)]
    _store(Namespace(db=None, url=url), Client(url, "NO_SUCH_TOKEN_ENV"),
           Namespace(name="long-run"), saved)
    assert "results saved in the server's trace DB" in capsys.readouterr().err
    con = app.state.serving.trace.cursor()
    try:
        assert con.execute("SELECT count(*) FROM loadtest_requests WHERE label = 'long'"
                           ).fetchone()[0] == 9000
        assert con.execute("SELECT requests FROM loadtest_runs WHERE label = 'long'"
                           ).fetchall() == [(9000,)]
    finally:
        con.close()


def test_a_hostile_results_body_is_refused_at_once_and_a_neighbour_is_served(server):
    """100,000 empty entries held a core for minutes (a transaction each): now a 400 by
    their count, and a request sent beside it is served."""
    import httpx

    url, _, _ = server

    async def both():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(
                client.post("/v1/loadtest/results", json={"runs": [{}] * 100_000}),
                client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}))

    bad, good = asyncio.run(both())
    assert bad.status_code == 400, bad.text[:300]
    assert "runs holds 100,000 entries" in bad.json()["error"]["message"]
    assert good.status_code == 200, good.text[:300]
