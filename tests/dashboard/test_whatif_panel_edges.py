"""The dashboard's what-if panel (dashboard/whatif_panel.py) by its pure functions, where the
AppTest scenarios (test_dashboard_whatif.py) do not look: the first rows it proposes, a 401
worded as a token problem, the SLO it sends, the table's columns under a rate scale and its
missing values, and the charts' series. On hand-made results, without Streamlit running."""

from __future__ import annotations

import pytest

from control.loadtest.records import SLO
from dashboard import whatif_panel as panel

SCALED = ["recorded", "predicted", "as-is@3x", "proposed"]


def result(columns: list[str], baseline: str = "predicted") -> dict:
    """A result as control/whatif/compare.py shapes it: one column per config, ratios of
    every column but recorded (the baseline's own: None under a rate scale)."""
    def ratios(value: float | None) -> dict:
        return {c: None if c == baseline != "predicted" else value for c in columns[1:]}

    rows = [
        {"metric": "requests", "values": dict.fromkeys(columns, 40), "ratios": ratios(1.0)},
        {"metric": "rejected", "values": dict.fromkeys(columns, 0), "ratios": ratios(None)},
        {"metric": "goodput_rps", "values": dict.fromkeys(columns), "ratios": ratios(None)},
        {"metric": "ttft_p50_s", "values": dict.fromkeys(columns, 0.1234),
         "ratios": ratios(1.5)}]
    summaries = {c: {name: {"p50": 0.1 * (i + 1) * k, "p99": 0.3 * (i + 1) * k}
                     for k, name in enumerate(("ttft", "tpot", "e2e"), 1)}
                 for i, c in enumerate(columns)}
    summaries[columns[-1]]["tpot"] = {"p50": None, "p99": None}  # one-token replies
    return {"columns": columns, "baseline": baseline, "rows": rows, "summaries": summaries}


def test_the_first_rows_halve_the_current_budgets():
    def settings(config):
        return list(panel.default_rows(config)["settings"])

    assert settings({"max_num_seqs": 8, "prefill_chunk_size": 256}) == [
        "max_num_seqs=4", "prefill_chunk_size=128"]
    assert settings(None) == ["max_num_seqs=16", "prefill_chunk_size=256"]
    assert settings({"max_num_seqs": 1, "prefill_chunk_size": 16}) == [
        "max_num_seqs=1", "prefill_chunk_size=16"]  # never below one sequence, 16 tokens


def test_a_missing_token_is_worded_as_a_token_problem():
    assert "The server refused the token (401)" in panel.problem(401, "token required", {})


def test_an_slo_goes_with_only_the_targets_it_sets():
    body = panel.request_body(None, None, {"proposed": {"max_num_seqs": 2}}, SLO(ttft_s=0.5))
    assert body["slo"] == {"ttft_s": 0.5}


def test_under_a_rate_scale_proposals_are_divided_by_as_is_at_that_rate():
    table = panel.ratio_frame(result(SCALED, baseline="as-is@3x"))
    assert list(table.columns) == ["recorded", "predicted as-is", "as-is@3x", "proposed",
                                   "as-is / recorded", "proposed / as-is@3x"]
    plain = panel.ratio_frame(result(["recorded", "predicted", "proposed"]))
    assert list(plain.columns)[-2:] == ["as-is / recorded", "proposed / as-is"]


def test_the_table_keeps_a_row_with_a_gap_and_shows_no_value_as_a_dash():
    table = panel.display_frame(panel.ratio_frame(result(["recorded", "predicted",
                                                          "proposed"])))
    assert list(table.index) == ["requests", "rejected", "ttft_p50_s"]  # goodput: no SLO
    assert list(table.loc["rejected"]) == ["0", "0", "0", panel.NONE, panel.NONE]  # 0 / 0
    assert list(table.loc["ttft_p50_s"]) == ["0.1234", "0.1234", "0.1234", "1.50x", "1.50x"]


def test_the_charts_show_each_configs_own_percentiles():
    got = result(["recorded", "predicted", "proposed"])
    frame = panel.latency_frame(got)
    seconds = {(r.config, r.latency, r.stat): r.seconds for r in frame.itertuples()}
    for column, label in (("recorded", "recorded"), ("predicted", panel.AS_IS)):
        for name, latency in panel.LATENCIES.items():
            for stat in ("p50", "p99"):
                expected = got["summaries"][column][name][stat]
                assert seconds[(label, latency, stat)] == pytest.approx(expected)
    assert ("proposed", "TPOT", "p99") not in seconds  # no TPOT: no bar, not a bar at 0
    assert seconds[("proposed", "E2E", "p99")] == pytest.approx(2.7)
