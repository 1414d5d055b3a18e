"""The what-if over a trace file replays a window under the config in force then: the
file holds the starting config only as the YAML (or defaults) it started from and every
later change as a diff, which the replay now applies in order (control/whatif/configs.py).
It once took the YAML for every window: a window recorded after `ctl set
batching=static` was replayed under continuous batching."""

from __future__ import annotations

import dataclasses
import json

import pytest
from whatif_sim_trace import START, read_trace_window, record

from control.cli.main import main
from control.whatif import window as window_module
from control.whatif.configs import recorded_config
from engine.config import EngineConfig, LiveConfig

LIVE = LiveConfig(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=128)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("changes") / "trace.duckdb")
    record(path, LIVE, n=120, rate_per_s=6.0,
           change_at=(40, {"batching": "static", "lanes": {"batch": {"weight": 3.0}}}))
    return path


def test_the_recorded_config_of_a_window_after_a_change_carries_it(db):
    after = read_trace_window(db, since=START + 9, until=None)  # request 40 came at ~6.7 s
    assert after.changes and after.facts.config_version == 2
    config, notes = recorded_config(after, EngineConfig(live=LIVE))
    assert config.live.batching == "static" and config.live.lane("batch").weight == 3.0
    assert any("replayed onto the base: batching, lanes.batch.weight" in n for n in notes)
    before = read_trace_window(db, since=None, until=START + 5)
    config, _ = recorded_config(before, EngineConfig(live=LIVE))
    assert before.changes == [] and config.live.batching == "continuous"


def test_the_budgets_the_server_fitted_at_start_up_are_the_recorded_ones(db):
    """No YAML holds budgets the server fitted to its device: the run's settings do, and
    the replay starts from them rather than the built-in defaults (a 512-token fitted
    chunk size was once replayed as 2048)."""
    window = read_trace_window(db, since=None, until=START + 5)
    fitted = dataclasses.replace(window, run_settings={
        **window.run_settings, "fitted_budgets": {"prefill_chunk_size": 200}})
    config, notes = recorded_config(fitted, EngineConfig())
    assert config.live.prefill_chunk_size == 200  # (chunks of 128 ran: not past it)
    assert "fitted by the server at start-up: prefill_chunk_size=200" in notes
    assert recorded_config(window, EngineConfig())[0].live.prefill_chunk_size == \
        EngineConfig().live.prefill_chunk_size


def self_prediction(db: str, capsys) -> dict[str, float]:
    """predicted / recorded of the window after the change, by metric."""
    assert main(["whatif", "--db", db, "--since", str(START + 9), "--json",
                 "--set", "max_num_seqs=8"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    return {r["metric"]: r["ratios"]["predicted"] for r in rows
            if r["ratios"].get("predicted") is not None}


def test_the_self_prediction_after_a_change_holds_and_missed_without_it(db, capsys,
                                                                          monkeypatch):
    replayed = self_prediction(db, capsys)
    for metric in ("ttft_p50_s", "e2e_p50_s"):
        assert replayed[metric] == pytest.approx(1.0, abs=0.15), (metric, replayed)
    monkeypatch.setattr(window_module, "_changes_up_to", lambda *a: [])  # as it was
    ignored = self_prediction(db, capsys)
    assert abs(ignored["ttft_p50_s"] - 1) > 2 * abs(replayed["ttft_p50_s"] - 1), ignored


def test_a_change_inside_the_window_is_counted_once_and_none_is_none(db):
    whole = read_trace_window(db)  # the change at request 40 is inside it
    assert whole.facts.config_changes == 1
    _, notes = recorded_config(whole, EngineConfig(live=LIVE))
    assert "the config changed 1 time(s) inside the window; every replay holds the config" \
        " in force at its start" in notes
    before = read_trace_window(db, since=None, until=START + 5)
    assert before.facts.config_changes == 0
    assert not any("time(s) inside the window" in n for n in
                   recorded_config(before, EngineConfig(live=LIVE))[1])


def test_a_chunk_larger_than_the_base_allows_sets_the_recorded_chunk_size(db):
    """The trace shows 128-token chunks ran: a base that says 64 was not the config in
    force, and a replay under it would split every prompt twice as often."""
    window = read_trace_window(db, since=None, until=START + 5)
    assert window.facts.max_prefill_chunk == 128
    config, notes = recorded_config(window, EngineConfig(live=LIVE.replace(
        prefill_chunk_size=64)))
    assert config.live.prefill_chunk_size == 128
    assert any(n.startswith("prefill_chunk_size=128: a chunk that large ran") for n in notes)
