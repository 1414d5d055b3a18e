"""Load-test metrics, report and store over a recorded run of 8 requests
(fixtures/loadtest_results.json). Every expected number is worked out by hand below.

The requests (times in s from send; SLO: TTFT <= 0.5, TPOT <= 0.15, E2E <= 2.0; run 4.0 s):
  #  outcome    lane         tenant stream prompt out  TTFT  E2E   chunk times
  0  ok         interactive  acme   yes    100    11   0.2   1.2   0.2, 0.3, ..., 1.2
  1  ok         interactive  beta   yes    50     5    0.1   0.58  0.1, 0.15, 0.25, 0.3, 0.58
  2  ok         (auto)       acme   no     2000   4    0.45  0.45  -
  3  ok         batch        beta   yes    300    1    0.4   0.4   0.4
  4  ok         interactive  acme   yes    120    6    0.9   1.55  0.9, 1.0, 1.1, 1.25, 1.4, 1.55
  5  rejected   batch        acme   no     0      0    -     0.01  -      (HTTP 429)
  6  cancelled  interactive  beta   yes    0      2    0.3   0.5   0.3, 0.4  (cancel at 0.5)
  7  timeout    (auto)       acme   no     0      0    -     3.0   -
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict

import duckdb
import numpy as np
import pytest
from fixtures.loadtest import FIXTURE, load_recorded
from fixtures.requires import require_module

from control.loadtest.metrics import (
    Dist,
    compare,
    distribution,
    itls_s,
    summarize,
    summary_from_dict,
    tpot_s,
)
from control.loadtest.records import SLO
from control.loadtest.report import markdown_report, plot_percentiles, text_table
from control.loadtest.store import REQUESTS_TABLE, RUNS_TABLE, rows_for_api, save, save_to_file

approx = pytest.approx


@pytest.fixture(scope="module")
def recorded():
    return load_recorded()


@pytest.fixture(scope="module")
def summary(recorded):
    results, duration_s, slo = recorded
    return summarize(results, duration_s, slo, label="baseline")


def test_fixture_loads_back_to_the_recorded_json(recorded):
    results, _, _ = recorded
    doc = json.loads(FIXTURE.read_text())
    assert [asdict(r) for r in results] == doc["results"]
    assert [r.outcome for r in results] == [
        "ok", "ok", "ok", "ok", "ok", "rejected", "cancelled", "timeout"]


def test_per_request_tpot_and_itl(recorded):
    r = recorded[0]
    assert tpot_s(r[0]) == approx(0.1)  # (1.2 - 0.2) / (11 - 1) = 1.0 / 10
    assert tpot_s(r[1]) == approx(0.12)  # (0.58 - 0.1) / (5 - 1) = 0.48 / 4
    assert tpot_s(r[4]) == approx(0.13)  # (1.55 - 0.9) / (6 - 1) = 0.65 / 5
    assert tpot_s(r[3]) is None  # one output token: no inter-token time
    assert tpot_s(r[2]) is None  # not streamed: its TTFT is the whole response
    # 0.15-0.1, 0.25-0.15, 0.3-0.25, 0.58-0.3
    assert itls_s(r[1]) == approx([0.05, 0.1, 0.05, 0.28])
    assert itls_s(r[0]) == approx([0.1] * 10)  # 11 chunks 0.1 s apart: 10 gaps
    assert itls_s(r[2]) == [] and itls_s(r[3]) == []


def test_percentiles_interpolate_linearly():
    d = distribution([10.0, 1.0, 3.0, 2.0, 4.0])  # sorted 1 2 3 4 10, n = 5
    assert d.count == 5 and d.mean == approx(4.0)  # 20 / 5
    assert d.p50 == approx(3.0)  # rank 0.50 * 4 = 2 -> 3
    assert d.p90 == approx(7.6)  # rank 3.6 -> 4 + 0.6 * (10 - 4)
    assert d.p95 == approx(8.8)  # rank 3.8 -> 4 + 0.8 * 6
    assert d.p99 == approx(9.76)  # rank 3.96 -> 4 + 0.96 * 6
    assert distribution([]) == Dist(0, None, None, None, None, None)


def test_ttft_tpot_itl_e2e_over_ok_requests(summary):
    # TTFT: streamed ok requests 0, 1, 3, 4 -> sorted 0.1 0.2 0.4 0.9 (n = 4, ranks x3)
    assert asdict(summary.ttft) == approx({
        "count": 4, "mean": 0.4,  # 1.6 / 4
        "p50": 0.3,  # rank 1.5 -> 0.2 + 0.5 * 0.2
        "p90": 0.75,  # rank 2.7 -> 0.4 + 0.7 * 0.5
        "p95": 0.825,  # rank 2.85 -> 0.4 + 0.85 * 0.5
        "p99": 0.885})  # rank 2.97 -> 0.4 + 0.97 * 0.5
    # TPOT: requests 0, 1, 4 -> 0.1 0.12 0.13 (3 is one token, 2 not streamed)
    assert asdict(summary.tpot) == approx({
        "count": 3, "mean": 0.35 / 3, "p50": 0.12,
        "p90": 0.128,  # rank 1.8 -> 0.12 + 0.8 * 0.01
        "p95": 0.129,  # rank 1.9 -> 0.12 + 0.9 * 0.01
        "p99": 0.1298})  # rank 1.98 -> 0.12 + 0.98 * 0.01
    # ITL: 10 x 0.1 (req 0) + 0.05 0.1 0.05 0.28 (req 1) + 0.1 0.1 0.15 0.15 0.15 (req 4);
    # the cancelled request's gap is left out. Sorted: 0.05 x2, 0.1 x13, 0.15 x3, 0.28.
    assert asdict(summary.itl) == approx({
        "count": 19, "mean": 2.13 / 19,  # 0.1 + 1.3 + 0.45 + 0.28 = 2.13
        "p50": 0.1,  # rank 9 -> the 10th: 0.1
        "p90": 0.15,  # rank 16.2 -> between the 17th and 18th: 0.15, 0.15
        "p95": 0.163,  # rank 17.1 -> 0.15 + 0.1 * (0.28 - 0.15)
        "p99": 0.2566})  # rank 17.82 -> 0.15 + 0.82 * 0.13
    # E2E: every ok request -> sorted 0.4 0.45 0.58 1.2 1.55 (n = 5, ranks x4)
    assert asdict(summary.e2e) == approx({
        "count": 5, "mean": 0.836,  # 4.18 / 5
        "p50": 0.58,  # rank 2
        "p90": 1.41,  # rank 3.6 -> 1.2 + 0.6 * 0.35
        "p95": 1.48,  # rank 3.8 -> 1.2 + 0.8 * 0.35
        "p99": 1.536})  # rank 3.96 -> 1.2 + 0.96 * 0.35


def test_outcomes_rates_and_throughput(summary):
    assert summary.requests == 8 and summary.ok == 5
    assert summary.outcomes == {"ok": 5, "rejected": 1, "timeout": 1, "cancelled": 1,
                                "error": 0}
    assert summary.rejected_rate == summary.timeout_rate == summary.cancelled_rate == 1 / 8
    assert summary.error_rate == 0.0
    assert summary.request_rps == approx(1.25)  # 5 ok / 4.0 s
    assert summary.output_tokens == 27  # 11 + 5 + 4 + 1 + 6
    assert summary.output_tps == approx(6.75)  # 27 / 4.0
    assert summary.prompt_tokens == 2570  # 100 + 50 + 2000 + 300 + 120
    assert summary.total_tps == approx(649.25)  # (2570 + 27) / 4.0


def test_a_latency_exactly_at_its_slo_meets_it(recorded):
    results, duration_s, _ = recorded
    # TTFT 0.4: requests 0 (0.2), 1 (0.1) and 3 (exactly 0.4) meet; 2 (0.45) and 4 (0.9) miss
    at = summarize(results, duration_s, SLO(ttft_s=0.4))
    assert (at.slo_met, at.slo_met_share) == (3, approx(0.6))
    # E2E 0.58: 1 (exactly 0.58), 2 (0.45) and 3 (0.4) meet
    assert summarize(results, duration_s, SLO(e2e_s=0.58)).slo_met == 3


def test_goodput_counts_ok_requests_meeting_every_slo(recorded, summary):
    results, duration_s, _ = recorded
    # Request 4 misses TTFT (0.9 > 0.5); the other 4 ok requests meet all three SLOs.
    assert summary.goodput_rps == approx(1.0)  # 4 / 4.0 s
    assert summary.slo_met_share == approx(0.8)  # 4 / 5
    assert summary.slo == {"ttft_s": 0.5, "tpot_s": 0.15, "e2e_s": 2.0}
    # TPOT only, 0.125: request 4 (0.13) misses; 2 (not streamed) and 3 (1 token) count as met
    tpot_only = summarize(results, duration_s, SLO(tpot_s=0.125))
    assert (tpot_only.goodput_rps, tpot_only.slo_met_share) == approx((1.0, 0.8))
    # TTFT 0.3: 0 (0.2) and 1 (0.1) meet; 2 (0.45, whole response), 3 (0.4), 4 (0.9) miss
    ttft_only = summarize(results, duration_s, SLO(ttft_s=0.3))
    assert (ttft_only.goodput_rps, ttft_only.slo_met_share) == approx((0.5, 0.4))
    for no_slo in (None, SLO()):
        s = summarize(results, duration_s, no_slo)
        assert s.goodput_rps is None and s.slo_met_share is None


def test_without_a_scenario_slo_goodput_counts_each_lanes_own_from_the_server(recorded):
    results, duration_s, _ = recorded
    results = [dataclasses.replace(r) for r in results]
    for r in results:  # the server ran them in two lanes and sent each lane's targets
        r.server_lane = "chat" if r.planned.index % 2 == 0 else "bulk"
        r.server_slo = {"ttft_s": 0.3, "tpot_s": None} if r.server_lane == "chat" else None
    s = summarize(results, duration_s, None)
    # chat: 0 (TTFT 0.2) meets 0.3; 2 (0.45) and 4 (0.9) miss; bulk has no targets
    assert s.slo == {"by_lane": {"chat": {"ttft_s": 0.3, "tpot_s": None, "e2e_s": None}}}
    assert s.goodput_rps == approx(0.25)  # 1 / 4.0 s
    assert "each lane's own, as the server sent them: chat TTFT <= 0.3 s" in markdown_report(
        "t", "", [s], [])
    given = summarize(results, duration_s, SLO(ttft_s=0.3))  # a given SLO wins
    assert given.slo == {"ttft_s": 0.3, "tpot_s": None, "e2e_s": None}
    assert given.goodput_rps == approx(0.5)
    # by the lane the server ran each in, whatever lane the client planned: each group's
    # latencies and the SLO its lane reported (what the go-live checklist judges)
    chat = s.by_server_lane["chat"]
    assert sorted(s.by_server_lane) == ["bulk", "chat"]
    assert chat.requests == sum(r.server_lane == "chat" for r in results)
    assert chat.slo == {"by_lane": {"chat": {"ttft_s": 0.3, "tpot_s": None, "e2e_s": None}}}
    assert s.by_server_lane["bulk"].slo is None
    assert chat.ttft.p99 == approx(float(np.percentile(
        [r.ttft_s for r in results if r.server_lane == "chat" and r.outcome == "ok"
         and r.planned.stream], 99)))
    assert summary_from_dict(asdict(s)).by_server_lane["chat"] == chat
    # a scenario's SLO is the load test's own: the lanes' groups keep their lane's
    assert given.by_server_lane["chat"].slo == chat.slo
    assert given.by_server_lane["chat"].goodput_rps == chat.goodput_rps


def test_requests_the_server_never_ran_have_no_server_lane(summary):
    assert summary.by_server_lane == {}  # the recording carries no batchpilot.lane


def test_by_lane_and_by_tenant(summary):
    lanes = summary.by_lane
    assert sorted(lanes) == ["auto", "batch", "interactive"]
    assert (lanes["interactive"].requests, lanes["interactive"].ok) == (4, 3)  # 0 1 4 6
    assert lanes["interactive"].cancelled_rate == 0.25  # 1 / 4
    assert lanes["interactive"].goodput_rps == approx(0.5)  # 0 and 1 good, / 4.0 s
    assert lanes["interactive"].slo_met_share == approx(2 / 3)
    assert lanes["batch"].outcomes["rejected"] == 1 and lanes["batch"].ok == 1  # 5, 3
    assert lanes["auto"].timeout_rate == 0.5  # 2 ok, 7 timeout
    assert lanes["auto"].ttft.count == 0 and lanes["auto"].e2e.p50 == approx(0.45)
    assert lanes["auto"].by_lane == {}  # groups are not split again
    tenants = summary.by_tenant
    assert {k: v.requests for k, v in tenants.items()} == {"acme": 5, "beta": 3}
    assert tenants["beta"].output_tps == approx(1.5)  # (5 + 1) / 4.0
    assert tenants["beta"].ttft.p50 == approx(0.25)  # 0.1 0.4 -> midway


def test_summary_is_json_and_reads_back(summary):
    text = json.dumps(asdict(summary))
    assert summary_from_dict(json.loads(text)) == summary


def test_summarize_rejects_a_zero_duration(recorded):
    with pytest.raises(ValueError, match="duration_s"):
        summarize(recorded[0], 0.0, None)


@pytest.fixture(scope="module")
def pair(recorded, summary):
    results, _, slo = recorded
    return [summary, summarize(results, 2.0, slo, label="fast")]  # same requests in half


def test_compare_ratios_to_the_baseline(pair):
    rows = {row["metric"]: row for row in compare(pair)}
    assert rows["request_rps"]["values"] == approx([1.25, 2.5])  # 5 / 4.0, 5 / 2.0
    assert rows["request_rps"]["ratios"] == approx([1.0, 2.0])
    assert rows["goodput_rps"]["ratios"] == approx([1.0, 2.0])  # 1.0 -> 2.0
    assert rows["ttft_p50"]["ratios"] == approx([1.0, 1.0])  # latencies unchanged
    assert rows["ttft_p50"]["unit"] == "s"
    assert rows["error_rate"]["ratios"] == [None, None]  # baseline 0: no ratio
    back = {row["metric"]: row for row in compare(pair, baseline=1)}
    assert back["output_tps"]["ratios"] == approx([0.5, 1.0])
    with pytest.raises(ValueError, match="baseline"):
        compare(pair, baseline=2)


def test_text_table_puts_configs_side_by_side(pair):
    table = text_table(pair)
    header, rule, *lines = table.splitlines()
    assert header.split() == ["metric", "unit", "baseline", "fast", "fast", "/", "baseline"]
    rps = next(line for line in lines if line.startswith("request_rps"))
    assert rps.split() == ["request_rps", "req/s", "1.25", "2.5", "2.00x"]
    ttft = next(line for line in lines if line.startswith("ttft_p99"))
    assert ttft.split() == ["ttft_p99", "s", "0.885", "0.885", "1.00x"]


def test_markdown_report_has_every_section(pair):
    notes = ["prompt lengths scaled x0.25 (the tiny model's context is 2048 tokens)"]
    md = markdown_report("mixed-lanes", "Chat and RAG from two tenants.", pair, notes)
    for heading in ("# Load test: mixed-lanes", "## Side by side", "## By lane",
                    "## By tenant", "## SLOs", "## Scaling and notes"):
        assert f"\n{heading}\n" in f"\n{md}"
    assert "Chat and RAG from two tenants." in md
    assert "- prompt lengths scaled x0.25" in md
    assert "TTFT <= 0.5 s, TPOT <= 0.15 s, E2E <= 2 s" in md
    assert "| request_rps | req/s | 1.25 | 2.5 | 2.00x |" in md
    # interactive: 4 requests, 3 ok, 1 cancelled, goodput 0.5 req/s, TTFT p50 of 0.1 0.2 0.9
    assert "| interactive | baseline | 4 | 3 | 0 | 0 | 1 | 0 | 0.5 | 0.75 | 0.2 |" in md
    assert "| auto | fast | 2 | 1 | 0 | 1 | 0 | 0 |" in md
    assert "| beta | baseline | 3 | 2 |" in md


def test_plot_percentiles_writes_a_png(pair, tmp_path):
    require_module("matplotlib", "pip install -e .")
    path = tmp_path / "percentiles.png"
    assert plot_percentiles(pair, path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000  # four panels drawn, not an empty canvas


def _table(con: duckdb.DuckDBPyConnection, table: str) -> list[dict]:
    cur = con.execute(f"SELECT * FROM {table} ORDER BY label, run_id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_store_saves_what_rows_for_api_returns(recorded, pair):
    results, _, _ = recorded
    con = duckdb.connect()
    for s in pair:
        save(con, "run-1", "mixed-lanes", s.label, "http://127.0.0.1:8000", s, results)
    runs = _table(con, RUNS_TABLE)
    assert [(r["label"], r["requests"], r["ok"]) for r in runs] == [
        ("baseline", 8, 5), ("fast", 8, 5)]
    base = runs[0]
    assert base["started"] == 1700000000.0  # the first sent_at
    assert (base["goodput_rps"], base["ttft_p50"], base["e2e_p99"]) == approx((1.0, 0.3, 1.536))
    assert summary_from_dict(json.loads(base["summary"])) == pair[0]
    requests = con.execute(
        f"SELECT * FROM {REQUESTS_TABLE} WHERE label = 'baseline' ORDER BY index").fetchall()
    names = [d[0] for d in con.description]
    rows = [dict(zip(names, row, strict=True)) for row in requests]
    api = rows_for_api("run-1", "mixed-lanes", "baseline", "http://127.0.0.1:8000", pair[0],
                       results)
    assert rows == api[REQUESTS_TABLE] and [base] == api[RUNS_TABLE]
    r1, r2, r6 = rows[1], rows[2], rows[6]
    assert (r1["tpot_s"], r1["itl_mean_s"], r1["itl_max_s"]) == approx((0.12, 0.12, 0.28))
    assert r2["lane"] is None and r2["stream"] is False and r2["itl_max_s"] is None
    assert (r6["outcome"], r6["cancelled_after_s"], r6["output_tokens"]) == ("cancelled", 0.5, 2)
    assert rows[5]["http_status"] == 429 and rows[7]["http_status"] is None
    json.dumps(api)  # JSON-able as it is


def test_save_to_file_appends_runs(recorded, summary, tmp_path):
    results, _, _ = recorded
    path = str(tmp_path / "loadtest.duckdb")
    for run_id in ("run-1", "run-2"):
        save_to_file(path, run_id, "mixed-lanes", "baseline", "http://x", summary, results,
                     started=1.0)
    con = duckdb.connect(path, read_only=True)
    try:
        assert con.execute(f"SELECT count(*) FROM {RUNS_TABLE}").fetchone() == (2,)
        assert con.execute(
            f"SELECT run_id, count(*), sum(output_tokens) FROM {REQUESTS_TABLE}"
            " GROUP BY run_id ORDER BY run_id").fetchall() == [("run-1", 8, 29), ("run-2", 8, 29)]
        assert con.execute(f"SELECT DISTINCT started FROM {RUNS_TABLE}").fetchall() == [(1.0,)]
    finally:
        con.close()


def test_a_planned_cancel_is_stored_only_for_requests_that_were_cancelled(recorded, summary):
    """A request that finished before its planned cancel was not cancelled after anything:
    a cancelled_after_s on it would count it among the client's cancels."""
    results, _, _ = recorded
    early = dataclasses.replace(results[0], planned=dataclasses.replace(
        results[0].planned, cancel_after_s=5.0))  # ok at 1.2 s, before its cancel at 5 s
    rows = rows_for_api("run-1", "mixed-lanes", "", "http://x", summary,
                        [early, results[6]])[REQUESTS_TABLE]
    assert [(r["outcome"], r["cancelled_after_s"]) for r in rows] == [
        ("ok", None), ("cancelled", 0.5)]
