"""The dashboard's what-if (Streamlit AppTest): the Control page's Predict replays the
form's change over the last window through the server's POST /v1/whatif and shows the
recorded / as-is / proposed table with ratios and the warnings, applying nothing; the
What-if page compares named configs live and over a trace file; every failure (tracing
off, an empty window, an invalid value, an unreachable server) is one message."""

from __future__ import annotations

import httpx
import pytest
from apptest_pages import open_page, texts
from fixtures.serving import LiveServer, make_engine
from whatif_server import REQUESTS, sim, whatif_server

from control.serve.settings import ServeSettings
from control.whatif.cli import WhatifError
from dashboard import whatif_panel
from dashboard.capacity_panel import capacity_sentences, parse_rates
from engine.config import LiveConfig

CONTROL, WHATIF = "views/control.py", "views/whatif.py"
TABLE_COLUMNS = ["recorded", "predicted as-is", "proposed", "as-is / recorded",
                 "proposed / as-is"]


@pytest.fixture(scope="module")
def url(tiny_loaded, tmp_path_factory):
    with whatif_server(tiny_loaded, tmp_path_factory.mktemp("whatif-ui")) as url:
        yield url


def version(url: str) -> int:
    return httpx.get(url + "/control/config").json()["version"]


def prediction(at):
    """The prediction's table (the Control page also shows the lanes and the history)."""
    return next(t.value for t in at.table if "recorded" in t.value.columns)


def predict_on_control(url: str, **numbers: int):
    at = open_page(CONTROL, bp_url=url)
    for key, value in numbers.items():
        at.number_input(key=f"bp_{key}").set_value(value)
    at.button(key="bp_predict").click().run(timeout=120)
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_predict_shows_recorded_as_is_and_proposed_and_applies_nothing(url):
    before = version(url)
    # steps of up to 1024 tokens: four times the largest the trace holds
    at = predict_on_control(url, max_num_batched_tokens=1024, prefill_chunk_size=512)
    assert "Prediction" in texts(at) and not at.error, [e.value for e in at.error]
    table = prediction(at)
    assert list(table.columns) == TABLE_COLUMNS
    assert table.loc["requests", "recorded"] == str(REQUESTS)
    assert table.loc["requests", "proposed"] == str(REQUESTS)
    assert table.loc["ttft_p50_s", "as-is / recorded"].endswith("x")
    assert table.loc["rejected", "proposed / as-is"] == whatif_panel.NONE  # 0 / 0
    # no SLO given: goodput by each recorded lane's own (the default lanes set some)
    assert "goodput_rps" in table.index and "slo_met_share" in table.index
    warnings = [w.value for w in at.warning]
    assert any("larger than any step the fit has seen" in w and "prefill_tokens" in w
               for w in warnings), warnings
    assert "`max_num_batched_tokens` 256 → 1024" in texts(at)
    assert version(url) == before  # a prediction applies nothing
    # ... and the server kept it in its audit, which the page lists
    rows = httpx.get(url + "/v1/trace/config_changes").json()
    assert any(r["source"] == "whatif" and '"prefill_chunk_size": [128, 512]' in r["change"]
               for r in rows), rows


def test_predict_with_an_invalid_value_names_the_field(url):
    at = predict_on_control(url, max_num_seqs=0)
    assert "Invalid `set`" in at.error[0].value
    assert "max_num_seqs=0 must be in 1..8192" in at.error[0].value
    assert not at.table


def test_predict_with_nothing_changed_says_so(url):
    at = predict_on_control(url)
    assert "Nothing changed in the form. Change a setting to predict" in texts(at)


def compare(at):
    at.button(key="bp_whatif_compare").click().run(timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_whatif_page_compares_named_configs_with_charts(url):
    at = compare(open_page(WHATIF, bp_url=url))
    assert not at.error, [e.value for e in at.error]
    table = prediction(at)
    assert {"fewer_seqs", "smaller_chunk", "fewer_seqs / as-is"} <= set(table.columns)
    assert float(table.loc["tpot_p99_s", "fewer_seqs"]) > 0
    charts = at.get("vega_lite_chart")
    assert len(charts) == 1 and all(f"{name} (s)" in charts[0].proto.spec
                                    for name in ("TTFT", "TPOT", "E2E"))


def test_whatif_page_on_an_empty_window_says_widen_it(url):
    at = open_page(WHATIF, bp_url=url)
    at.sidebar.selectbox(key="bp_window").set_value("5 min").run()
    at = compare(at)
    assert at.error[0].value == whatif_panel.EMPTY_WINDOW


def test_whatif_page_over_a_trace_file_predicts_here(tmp_path):
    path = str(tmp_path / "trace.duckdb")
    sim.record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                prefill_chunk_size=128), n=40)
    at = compare(open_page(WHATIF, bp_db=path))
    assert not at.error, [e.value for e in at.error]
    assert prediction(at).loc["requests", "recorded"] == "40"
    assert any("built-in defaults" in c.value for c in at.caption)


def test_whatif_page_unreachable_server_is_one_message():
    at = compare(open_page(WHATIF, bp_url="http://127.0.0.1:9"))
    assert "Cannot reach the server for a prediction" in at.error[0].value


def test_tracing_off_is_said_plainly(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(model="tiny"))
    try:
        with LiveServer(engine, settings) as url:
            at = predict_on_control(url, max_num_seqs=3)
            assert "Tracing is off on this server" in at.error[0].value
            assert "--trace-db" in at.error[0].value
    finally:
        engine.stop()


@pytest.mark.parametrize(("status", "body", "needle"), [
    (None, {}, "Cannot reach the server"),
    (404, {"error": {"code": "trace_off"}}, "Tracing is off"),
    (404, {"error": {"code": "not_found"}}, "no what-if endpoint"),
    (400, {"error": {"param": "since"}}, "No request that ended arrived"),
    (400, {"error": {"param": "compare.x"}}, "Invalid `compare.x`: boom"),
    (403, {}, "refused the token (403)"),
    (503, {}, "still loading"),
])
def test_each_failure_is_worded_for_the_operator(status, body, needle):
    message = "no request arrived in the window" if body.get("error", {}).get(
        "param") == "since" else "boom"
    assert needle in whatif_panel.problem(status, message, body)


def test_rows_parse_like_the_cli_and_name_a_bad_row():
    rows = [{"name": "a", "settings": "max_num_seqs=4, lanes.batch.weight=2"},
            {"name": "", "settings": ""}]
    assert whatif_panel.parse_rows(rows) == {
        "a": {"max_num_seqs": 4, "lanes": {"batch": {"weight": 2}}}}
    with pytest.raises(WhatifError, match="row 'b' needs both"):
        whatif_panel.parse_rows([{"name": "b", "settings": None}])
    with pytest.raises(WhatifError, match="not KEY=VALUE"):
        whatif_panel.parse_rows([{"name": "c", "settings": "max_num_seqs"}])
    body = whatif_panel.request_body(1.0, 2.0, {"proposed": {"x": 1}, "b": {"y": 2}}, None)
    assert body == {"since": 1.0, "until": 2.0, "set": {"x": 1}, "compare": {"b": {"y": 2}}}



def test_whatif_page_at_a_rate_scale_and_with_a_capacity_sweep(tmp_path):
    """Over a trace file (replayed here): rate scale 3 on 2 replicas puts the rows beside
    as-is@3x,2rep, and a sweep draws goodput and TTFT against rate, with each config's
    capacity in words."""
    path = str(tmp_path / "trace.duckdb")
    sim.record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                prefill_chunk_size=128), n=40)
    at = open_page(WHATIF, bp_db=path)
    at.number_input(key="bp_whatif_rate_scale").set_value(3.0)
    at.number_input(key="bp_whatif_replicas").set_value(2)
    at.text_input(key="bp_whatif_rate_sweep").input("2, 1")
    at = compare(at)
    assert not at.error, [e.value for e in at.error]
    table = prediction(at)
    assert {"as-is@3x,2rep", "fewer_seqs / as-is@3x,2rep", "as-is / recorded"} <= set(
        table.columns)
    assert "fewer_seqs / as-is" not in table.columns
    assert "Capacity" in [h.value for h in at.subheader]
    assert any("**as-is**: " in m.value and "**fewer_seqs**: " in m.value
               for m in at.markdown)
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any("goodput (requests meeting their SLO /s)" in s and "TTFT p99 (s)" in s
               for s in specs)
    sweep = next(d.value for d in at.dataframe if "rate x" in d.value.columns)
    assert sorted(set(sweep["rate x"])) == [1.0, 2.0]
    assert set(sweep["config"]) == {"as-is", "fewer_seqs", "smaller_chunk"}


@pytest.mark.parametrize(("scale", "sweep", "needle"), [
    (1.0, "1, x", "rate sweep '1, x' must be comma-separated numbers"),
    (1.0, "1, 1", "names a rate scale twice"),
    (1.0, "1, 500", "rate sweep[1]=500.0 must be a number in (0, 100]"),
])
def test_a_bad_rate_is_one_message_naming_it(tmp_path, scale, sweep, needle):
    path = str(tmp_path / "trace.duckdb")
    sim.record(path, LiveConfig(max_num_seqs=8), n=10)
    at = open_page(WHATIF, bp_db=path)
    at.text_input(key="bp_whatif_rate_sweep").input(sweep)
    at = compare(at)
    assert len(at.error) == 1 and needle in at.error[0].value, [e.value for e in at.error]


def test_the_rates_go_to_the_server_as_the_api_takes_them():
    body = whatif_panel.request_body(1.0, 2.0, {"b": {"y": 2}}, None,
                                     parse_rates(2.0, "0.5, 1,2"))
    assert body["rate_scale"] == 2.0 and body["rate_sweep"] == [0.5, 1.0, 2.0]
    assert parse_rates(1.0, " ") == {}


def test_capacity_in_words_says_at_least_only_at_the_highest_rate_swept():
    """The highest swept rate is a floor (a higher one was not tried); a lower capacity is
    where the share fell, so it is said as is."""
    capacity = {"rates": [0.5, 1.0, 2.0], "met_share_for_capacity": 0.9,
                "capacity": {"as-is": 2.0, "fewer_seqs": 0.5, "tiny": None}}
    assert capacity_sentences(capacity) == [
        "**as-is**: carries at least **2x** the recorded rate with 90% of requests meeting"
        " their SLO",
        "**fewer_seqs**: carries **0.5x** the recorded rate with 90% of requests meeting"
        " their SLO",
        "**tiny**: below 90% meeting their SLO already at 0.5x"]


def test_a_live_prediction_sends_the_operators_token(monkeypatch):
    """POST /v1/whatif is a control route: on a server with tokens it needs the one the
    Control page acts with ($--token-env)."""
    from types import SimpleNamespace

    sent = []

    def answer(base, path, **kw):
        sent.append((base, path, kw["headers"]))
        return {"columns": []}

    monkeypatch.setattr(whatif_panel, "request_json", answer)
    monkeypatch.setenv("OPS_TOKEN", "adm1n-secret")
    ctx = SimpleNamespace(control=SimpleNamespace(url="http://127.0.0.1:9"),
                          token_env="OPS_TOKEN")
    assert whatif_panel._from_server(ctx, {"set": {"max_num_seqs": 2}}) == {"columns": []}
    assert sent == [("http://127.0.0.1:9", "/v1/whatif",
                     {"Authorization": "Bearer adm1n-secret"})]
