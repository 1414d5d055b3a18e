"""The Streamlit dashboard, page by page (streamlit's AppTest runs each page's script):
over a recorded trace file, and live against a server under a short load, including the
Control page's form calling the control API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from apptest_pages import (
    APP,
    CANARY,
    CHECKLIST,
    CONTROL,
    FLEET,
    NO_CHARTS,
    OVERVIEW,
    PAGES,
    REQUESTS,
    SCHEDULER,
    charts_of,
    open_page,
    problems,
    texts,
)
from fixtures.serving import LiveServer, make_engine
from fixtures.trace_data import fill_goodput_trace, fill_trace
from streamlit.testing.v1 import AppTest

from control.serve.settings import ServeSettings


def test_the_smoke_covers_every_page_of_the_app():
    views = sorted(f"views/{p.name}" for p in (Path(APP).parent / "views").glob("*.py"))
    assert sorted(PAGES) == views and CANARY in PAGES


@pytest.fixture(scope="module")
def trace_db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("dash") / "trace.duckdb")
    fill_trace(path).stop()
    return path


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_a_recorded_trace(trace_db, page):
    at = open_page(page, bp_db=trace_db)
    assert not problems(at), problems(at)
    if page not in NO_CHARTS:
        assert charts_of(at) >= 1
    assert "trace file" in texts(at)


def test_overview_shows_the_workload_and_the_scheduler_its_steps(trace_db):
    at = open_page(OVERVIEW, bp_db=trace_db)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == "9" and metrics["Rejected"] == "1"
    assert metrics["Timeouts + cancels"] == "1"  # r5, cancelled while queued
    assert charts_of(at) == 6  # 4 latency panels, tokens/s, failures
    at = open_page(SCHEDULER, bp_db=trace_db)
    assert charts_of(at) >= 7
    assert len(at.dataframe) == 1 and at.dataframe[0].value.shape[0] > 10


def time_axes(spec: object) -> list[dict]:
    """Every x encoding of a temporal field in a Vega-Lite spec, layers included."""
    found = []
    if isinstance(spec, dict):
        x = (spec.get("encoding") or {}).get("x")
        if isinstance(x, dict) and x.get("type") == "temporal":
            found.append(x)
        for value in spec.values():
            found += time_axes(value)
    elif isinstance(spec, list):
        for value in spec:
            found += time_axes(value)
    return found


@pytest.mark.parametrize("page", [OVERVIEW, SCHEDULER])
def test_time_axes_read_a_24_hour_clock(trace_db, page):
    """Vega's default labels a minute tick on a 12-hour clock with no AM/PM: 16:50 read
    "04:50" on the Overview. Every chart's time axis says the hour as the trace does."""
    import json

    at = open_page(page, bp_db=trace_db)
    axes = [x for chart in at.get("vega_lite_chart")
            for x in time_axes(json.loads(chart.proto.spec))]
    assert axes, "no time axis drawn"
    assert all((x.get("axis") or {}).get("format") == "%H:%M:%S" for x in axes), axes


def test_a_line_chart_of_zeros_gets_a_readable_scale():
    """Nobody waited: Vega's own domain for all zeros labels its one tick "0.000000"."""
    import pandas as pd

    from dashboard import charts

    df = pd.DataFrame({"time": pd.to_datetime([0, 5], unit="s"), "lane": ["a", "a"],
                       "waiting": [0.0, 0.0]})
    spec = charts.lines(df, "lane", "waiting", "Waiting", "requests", pd.DataFrame()).to_dict()
    assert spec["encoding"]["y"]["scale"] == {"domain": [0, 1]}
    spec = charts.lines(df.assign(waiting=[0.0, 3.0]), "lane", "waiting", "Waiting",
                        "requests", pd.DataFrame()).to_dict()
    assert "scale" not in spec["encoding"]["y"]


def test_chart_times_are_read_as_epoch_seconds():
    import pandas as pd

    from dashboard import charts

    df = charts.frame([{"time": 1_700_000_000.5, "steps": 3}])
    assert df["time"][0] == pd.Timestamp("2023-11-14 22:13:20.5", tz="UTC")


def test_a_whatif_prediction_draws_no_change_rule():
    from dashboard import charts

    change = {"max_num_seqs": [4, 3]}
    rows = [{"time": 1_700_000_000.0, "version": 2, "source": "api", "actor": "ops",
             "change": change},
            {"time": 1_700_000_060.0, "version": 2, "source": "whatif", "actor": "ops",
             "change": change}]  # a what-if's prediction: nothing changed then
    rules = charts.change_rules(charts.changes_frame(rows))
    assert list(rules.data["source"]) == ["api"]
    assert list(rules.data["diff"]) == ["max_num_seqs: 4 -> 3"]
    assert charts.change_rules(charts.changes_frame(rows[1:])) is None


def test_overview_counts_deferred_admissions_and_charts_them_by_reason(tmp_path):
    """A burst under slo_unreachable: defer: the late requests show as Deferred (they were
    served, so not in Rejected) and as `deferred: slo_deferred` bars."""
    path = str(tmp_path / "defer.duckdb")
    fill_goodput_trace(path, slo_unreachable="defer")
    at = open_page(OVERVIEW, bp_db=path)
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["Deferred"]) > 0 and metrics["Rejected"] == "0"
    bars = [c for c in at.get("vega_lite_chart")
            if "deferred: slo_deferred" in str(c.proto.spec) + str(c.proto.datasets)]
    assert len(bars) == 1


def metrics_e2e(at: AppTest) -> float:
    """The E2E metric of the Requests page's one request, seconds."""
    return float(next(m.value for m in at.metric if m.label == "E2E").removesuffix(" s"))


def test_requests_page_explains_one_request(trace_db):
    at = open_page(REQUESTS, bp_db=trace_db)
    slow = at.dataframe[0].value
    assert list(slow["e2e_s"]) == sorted(slow["e2e_s"], reverse=True)
    at.text_input(key="bp_request_id").input("r1").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Outcome"] == "finished"
    events = at.dataframe[1].value
    assert {"arrival", "first_token", "finished"} <= set(events["event"])
    # milliseconds from arrival: a request's events often fall within one second
    since = events.set_index("event")["since arrival (ms)"]
    assert since["arrival"] == 0 and 0 < since["first_token"] < since["finished"]
    assert since["finished"] == pytest.approx(1000 * metrics_e2e(at), rel=0.01)
    at.text_input(key="bp_request_id").input("no-such-request").run()
    assert "not in the trace" in at.error[0].value


def test_control_page_over_a_file_lists_recorded_changes(trace_db):
    at = open_page(CONTROL, bp_db=trace_db)
    table = at.dataframe[0].value
    assert list(table["diff"]) == ["max_num_seqs: 4 -> 3"]
    assert not at.button  # read-only: no form, no rollback


@pytest.fixture(scope="module")
def live_url(tiny_loaded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash-live")
    settings = ServeSettings(model="tiny", trace_db=str(tmp / "trace.duckdb"))
    engine, _, settings = make_engine(tiny_loaded, settings=settings, max_num_seqs=4)
    with LiveServer(engine, settings) as url:
        asyncio.run(load(url))
        yield url
    engine.stop()


async def load(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async def one(i: int) -> None:
            r = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": f"request {i} " * (1 + i), "max_tokens": 6},
                headers={"X-Tenant": f"t{i % 2}"})
            assert r.status_code == 200, r.text
        await asyncio.gather(*(one(i) for i in range(6)))


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_live(live_url, page):
    at = open_page(page, bp_url=live_url)
    assert not problems(at), problems(at)
    assert "server" in texts(at)
    if page == CANARY:  # a single server: says where canaries run, never a blank page
        assert "This server is not a fleet" in texts(at)
    if page == FLEET:
        assert "is not a fleet" in texts(at)


def config(url: str) -> dict:
    return httpx.get(url + "/control/config").json()


def test_control_form_applies_validates_and_rolls_back(live_url):
    before = config(live_url)
    at = open_page(CONTROL, bp_url=live_url)
    at.number_input(key="bp_max_num_seqs").set_value(3)
    at.text_input(key="bp_reason").input("dashboard test")
    at.button(key="bp_apply").click().run()
    assert not at.exception
    after = config(live_url)
    assert after["version"] == before["version"] + 1
    assert after["config"]["max_num_seqs"] == 3
    assert "applied: now version" in texts(at)

    at = open_page(CONTROL, bp_url=live_url)  # a high watermark above the reject one
    at.number_input(key="bp_kv_cache_high_watermark").set_value(0.99)
    at.button(key="bp_apply").click().run()
    assert "the server answered 400" in at.error[0].value
    assert "kv_cache_high_watermark" in at.error[0].value
    assert config(live_url)["version"] == after["version"]

    at = open_page(CONTROL, bp_url=live_url)
    at.selectbox(key="bp_rollback_to").set_value(before["version"])
    at.button(key="bp_rollback").click().run()
    now = config(live_url)
    assert now["version"] == after["version"] + 1
    assert now["config"]["max_num_seqs"] == before["config"]["max_num_seqs"]


def test_control_page_shows_which_lanes_take_the_default_slo(live_url):
    """A lane without its own SLO counts default_slo's (it once read "no targets")."""
    def set_default(slo):
        version = config(live_url)["version"]
        reply = httpx.patch(live_url + "/control/config", headers={"If-Match": str(version)},
                            json={"changes": {"default_slo": slo}, "reason": "test"})
        assert reply.status_code == 200, reply.text

    set_default({"ttft_s": 10.0})
    try:
        shown = texts(open_page(CONTROL, bp_url=live_url))
        assert "empty: the default SLO, TTFT 10 s)" in shown
        assert "batch: TTFT 10 s (default)" in shown
        assert "interactive: TTFT 5 s, TPOT 0.5 s" in shown  # its own
    finally:
        set_default({"ttft_s": None, "tpot_s": None})
    assert "batch: no targets" in texts(open_page(CONTROL, bp_url=live_url))


def test_checklist_page_shows_each_verdict_with_its_evidence(live_url):
    at = open_page(CHECKLIST, bp_url=live_url)
    metrics = {m.label: int(m.value) for m in at.metric}
    assert sum(metrics.values()) >= 10 and metrics["fail"] >= 1
    titles = [e.label for e in at.expander]
    assert any("[fail]" in t and "Load test run" in t for t in titles), titles  # none stored
    assert any("[pass]" in t for t in titles), titles
    assert "not ready to go live" in at.error[0].value
    markdown = at.get("download_button")[0]
    assert markdown is not None
