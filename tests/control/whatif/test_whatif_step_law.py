"""A server whose steps were held to target_step_ms by its start-up step law
(engine/scheduling/step_time.py) is replayed under the same law: the law travels in the trace's run
settings (TraceWriter.note_run), and without it the replay would predict another run."""

from __future__ import annotations

import dataclasses
import json
import statistics

import duckdb
import pytest
from whatif_sim_trace import STATIC, read_trace_window, record

from control.whatif.calibrate import calibrate
from control.whatif.compare import PREDICTED, RECORDED
from control.whatif.replay import replay
from control.whatif.run import predict
from control.whatif.window import Window
from engine.calibration.step_law import StepLaw
from engine.config import EngineConfig, LiveConfig

LIVE = LiveConfig(max_num_seqs=16, max_num_batched_tokens=256, prefill_chunk_size=128)
TIMED = dataclasses.replace(STATIC, target_step_ms=40)
# The scheduler's law (not the sim's own step cost): it binds at a 40 ms target.
LAW = StepLaw(0.004, 0.0002, 2e-7, 2e-5)


_window = read_trace_window


@pytest.fixture(scope="module")
def timed_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("timed") / "trace.duckdb")
    record(path, LIVE, n=150, rate_per_s=9.0, static=TIMED, step_law=LAW)
    return path


@pytest.fixture(scope="module")
def timed(timed_path) -> Window:
    return _window(timed_path)


def test_the_run_settings_carry_the_law_and_the_window_reads_it_back(timed):
    assert dataclasses.astuple(timed.step_law) == pytest.approx(dataclasses.astuple(LAW))
    assert timed.run_settings["target_step_ms"] == 40
    note = next(note for note in timed.notes if "start-up step law" in note)
    # the default goodput policy grows steps past the target: the note must not say "held"
    assert "sized from target_step_ms=40" in note and "own step_policy" in note


def test_self_prediction_under_the_law_reproduces_the_run_and_without_it_does_not(timed):
    config = EngineConfig(TIMED, LIVE)
    result = predict(timed, config, {}, exact=True)
    rec, pred = result["summaries"][RECORDED], result["summaries"][PREDICTED]
    for metric in ("ttft", "e2e"):
        assert pred[metric]["p50"] == pytest.approx(rec[metric]["p50"], rel=0.05), metric
    bare = dataclasses.replace(timed, run_settings={})
    assert bare.step_law is None
    unheld = predict(bare, config, {}, exact=True)["summaries"][PREDICTED]
    # without the law the replay runs bigger steps: another TTFT than the server's (the
    # mean: once the served law refits to the device, the medians come close, the tails not)
    assert abs(unheld["ttft"]["mean"] - rec["ttft"]["mean"]) > 0.2 * rec["ttft"]["mean"], \
        json.dumps({"recorded": rec["ttft"], "unheld": unheld["ttft"]})


def test_a_window_after_the_server_refitted_its_law_replays_under_the_refit(timed_path):
    """LAW is not the sim's cost (its shape differs), so the server refits it from served
    steps (engine/calibration/online_law.py) and its trace says so in a step_law_refit
    row. A window that starts after the refit replays under the refitted law; a row of
    that source is never replayed as a config version."""
    from control.checklist.trace_config import config_from_trace
    from control.trace.audit_sources import LAW_REFIT_SOURCE, is_config_version
    from control.trace.store import open_read_only
    from control.whatif.window import read_window

    con = open_read_only(timed_path)
    try:
        rows = con.execute("SELECT time, actor, change FROM config_changes WHERE source = ?"
                           " ORDER BY time", [LAW_REFIT_SOURCE]).fetchall()
        assert rows, "the server never refitted LAW"
        at, actor, change = rows[0]
        old, new = json.loads(change)["step_law"]
        assert actor == "scheduler" and old == LAW.to_dict() and new != old
        later = read_window(con, at + 0.5, None)
    finally:
        con.close()
    in_force = [json.loads(c)["step_law"][1] for t, _, c in rows if t <= at + 0.5][-1]
    assert later.law_refit == in_force  # the last refit before the window's start
    assert later.step_law != LAW
    assert any("refitted from served steps" in note for note in later.notes), later.notes
    assert not is_config_version(LAW_REFIT_SOURCE)
    config, _, _ = config_from_trace({}, [{"time": at, "source": LAW_REFIT_SOURCE,
                                           "change": change}])
    assert "step_law" not in config


def test_resends_are_recorded_and_replayed_as_resends(tmp_path):
    """A client's resend is admitted deferred (engine/lanes/admission.py); the trace keeps
    the flag (requests.resent) and the replay defers it as the server did. Replayed as a
    fresh request it would start sooner, and the requests on time later."""
    path = str(tmp_path / "trace.duckdb")
    record(path, LIVE, n=150, rate_per_s=9.0, static=TIMED, step_law=LAW, resent_every=3)
    window = _window(path)
    resent = [i for i, r in enumerate(window.requests) if r.resent]
    assert len(resent) == 50
    config, model = EngineConfig(TIMED, LIVE), calibrate(window.samples)
    as_recorded = replay(window, config, model)
    as_fresh = replay(dataclasses.replace(window, requests=[
        dataclasses.replace(r, resent=False) for r in window.requests]), config, model)

    def mean_ttft(records, which) -> float:
        return statistics.mean(records[i].ttft_s for i in which)

    on_time = [i for i in range(len(window.requests)) if i not in set(resent)]
    for group in (resent, on_time):
        assert mean_ttft(as_recorded.records, group) == pytest.approx(
            mean_ttft(window.requests, group), rel=0.05)
    assert mean_ttft(as_fresh.records, resent) < 0.8 * mean_ttft(window.requests, resent)
    assert mean_ttft(as_fresh.records, on_time) > 1.2 * mean_ttft(window.requests, on_time)


def test_a_trace_from_before_resends_were_recorded_reads_as_none_resent(tmp_path):
    """A schema-5 file opened read-only (not migrated) has no requests.resent column."""
    path = str(tmp_path / "old.duckdb")
    record(path, LIVE, n=20, rate_per_s=9.0, static=TIMED, step_law=LAW, resent_every=2)
    con = duckdb.connect(path)
    con.execute("ALTER TABLE requests DROP COLUMN resent")
    con.close()
    window = _window(path)
    assert len(window.requests) == 20 and not any(r.resent for r in window.requests)
