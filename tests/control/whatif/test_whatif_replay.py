"""Replay: a trace recorded from a simulated engine with a known step law is predicted
back (self-prediction), deterministically, and a config change is predicted in the
direction, and near the amount, that the same workload recorded under it shows."""

from __future__ import annotations

import dataclasses

import pytest
from whatif_sim_trace import START, STATIC, read_trace_window, record

from control.whatif.calibrate import calibrate
from control.whatif.compare import PREDICTED, RECORDED, compare
from control.whatif.replay import output_lengths, replay
from control.whatif.run import predict
from control.whatif.summary import predicted_summary, recorded_summary
from control.whatif.window import RecordedRequest, Window
from engine.config import EngineConfig, LiveConfig

LIVE = LiveConfig(max_num_seqs=16, max_num_batched_tokens=256, prefill_chunk_size=128)


_window = read_trace_window


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Window]:
    """The same workload (with client cancels) recorded under max_num_seqs 16 and 4."""
    out = {}
    for name, live in (("seqs16", LIVE), ("seqs4", LIVE.replace(max_num_seqs=4))):
        path = str(tmp_path_factory.mktemp(name) / "trace.duckdb")
        record(path, live, n=200, rate_per_s=9.0, cancel_every=10)
        out[name] = _window(path)
    return out


def _p(summary: dict, metric: str, stat: str) -> float:
    return summary[metric][stat]


def test_self_prediction_reproduces_the_recorded_run(traces):
    window = traces["seqs16"]
    result = predict(window, EngineConfig(STATIC, LIVE), {}, exact=True)
    rec, pred = result["summaries"][RECORDED], result["summaries"][PREDICTED]
    # queue delays here are a few steps long: one step more (the replay's window starts
    # with a cold prefix cache) moves one by several percent
    for metric, rel in (("ttft", 0.03), ("tpot", 0.03), ("e2e", 0.03), ("queue", 0.10)):
        for stat in ("p50", "p99"):
            assert _p(pred, metric, stat) == pytest.approx(_p(rec, metric, stat), rel=rel), \
                (metric, stat)
    for outcome in ("finished", "cancelled", "rejected", "timeout"):
        assert pred[outcome] == rec[outcome], outcome
    assert rec["cancelled"] >= 5  # some aborts came after their request had finished
    assert pred["kv_peak_blocks"] == pytest.approx(rec["kv_peak_blocks"], rel=0.05)
    assert result["calibration"]["in_sample"]["r2"] > 0.999
    assert not result["warnings"]


def test_replay_is_deterministic(traces):
    window = traces["seqs16"]
    model = calibrate(window.samples)
    config = EngineConfig(STATIC, LIVE.replace(max_num_seqs=6))
    a, b = (replay(window, config, model) for _ in range(2))
    assert [(r.request_id, r.finish_reason, r.token_times) for r in a.records] == \
        [(r.request_id, r.finish_reason, r.token_times) for r in b.records]
    assert (a.steps, a.kv_peak_blocks, a.preempted) == (b.steps, b.kv_peak_blocks, b.preempted)


def test_fewer_sequences_is_predicted_as_it_happens(traces):
    """Predict max_num_seqs=4 from the seqs16 trace; compare with the seqs4 recording."""
    result = predict(traces["seqs16"], EngineConfig(STATIC, LIVE),
                     {"seqs4": {"max_num_seqs": 4}, "seqs64": {"max_num_seqs": 64}},
                     exact=True)
    pred = result["summaries"]
    actual = recorded_summary(traces["seqs4"], None)
    assert _p(pred["seqs4"], "ttft", "p99") > 1.5 * _p(pred[PREDICTED], "ttft", "p99")
    assert _p(pred["seqs4"], "queue", "p99") > 2 * _p(pred[PREDICTED], "queue", "p99")
    for stat in ("p50", "p99"):
        assert _p(pred["seqs4"], "ttft", stat) == pytest.approx(
            _p(actual, "ttft", stat), rel=0.10), stat
        assert _p(pred["seqs4"], "e2e", stat) == pytest.approx(
            _p(actual, "e2e", stat), rel=0.10), stat
    # never more than 16 ran at once in the recording: 64 changes nothing
    assert _p(pred["seqs64"], "ttft", "p99") == _p(pred[PREDICTED], "ttft", "p99")
    row = next(r for r in result["rows"] if r["metric"] == "ttft_p99_s")
    assert row["ratios"]["seqs4"] > 1.5 and row["ratios"]["seqs64"] == 1.0


def test_steps_larger_than_the_fit_saw_are_an_explicit_warning(traces):
    """Calibrated on max_num_seqs=4 steps: 32 running at once is extrapolation."""
    window = traces["seqs4"]
    base = EngineConfig(STATIC, LIVE.replace(max_num_seqs=4))
    result = predict(window, base, {"wide": {"max_num_seqs": 32}}, exact=True)
    warned = [w for w in result["warnings"] if w.startswith("wide:")]
    assert warned and "larger than any step the fit has seen" in warned[0]
    assert "num_seqs" in warned[0]
    assert result["replays"]["wide"]["beyond_seen_steps"] > 0
    assert not any(w.startswith(f"{PREDICTED}:") for w in result["warnings"])


def test_an_invalid_proposal_names_it_and_its_field(traces):
    with pytest.raises(ValueError, match=r"bad: max_num_seqs=0 must be in 1\.\.8192"):
        predict(traces["seqs16"], EngineConfig(STATIC, LIVE), {"bad": {"max_num_seqs": 0}},
                exact=True)
    with pytest.raises(ValueError, match="static setting"):
        predict(traces["seqs16"], EngineConfig(STATIC, LIVE), {"s": {"block_size": 32}},
                exact=True)


def test_the_same_summary_reads_recorded_and_predicted_requests(traces):
    window = traces["seqs16"]
    p = replay(window, EngineConfig(STATIC, LIVE), calibrate(window.samples))
    s = predicted_summary(p, window.duration_s, None)
    assert set(s) == set(recorded_summary(window, None))
    assert set(s["by_tenant"]) == {"chat", "rag"}


def test_a_self_prediction_that_misses_low_is_warned_about(traces):
    """A law whose steps take half as long predicts the recorded run's own latencies about
    half what they were: a miss as plain below the recording as above it."""
    window = traces["seqs16"]
    model = calibrate(window.samples)
    half = dataclasses.replace(model, coef=tuple(c / 2 for c in model.coef),
                               gap_s=model.gap_s / 2)
    result = compare(window, half, EngineConfig(STATIC, LIVE), {})
    missed = [w for w in result["warnings"] if w.startswith("self-prediction misses")]
    assert any(w.startswith("self-prediction misses the recorded TTFT p50 by -")
               for w in missed), result["warnings"]
    assert not [w for w in compare(window, model, EngineConfig(STATIC, LIVE), {})["warnings"]
                if w.startswith("self-prediction misses")]


def test_requests_running_when_the_window_opened_are_a_warning(traces):
    window = traces["seqs16"]
    opened = dataclasses.replace(window, facts=dataclasses.replace(window.facts,
                                                                   running_at_start=3))
    result = predict(opened, EngineConfig(STATIC, LIVE), {}, exact=True)
    assert any(w.startswith("3 requests were already running when the window opened")
               for w in result["warnings"]), result["warnings"]


def test_a_too_long_rejection_asks_for_too_much_again():
    """A request refused as too long never showed its output length: the replay asks for
    enough that prompt + max_tokens is past max_model_len again (engine check_length)."""
    refused = RecordedRequest("run1", "r0", "default", "acme", 0, "rejected", "too_long",
                              2000, 0, 0, 0, START, START, None, None, None, None, None, 0.0)
    (max_tokens,) = output_lengths([refused], max_model_len=2048)
    assert refused.num_prompt_tokens + max_tokens > 2048


def test_the_engine_loops_gap_is_not_measured_across_idle_time(tmp_path):
    """Requests 2 s apart, each done in one step: the engine was idle between them, so no
    step-to-step gap is the engine loop's. Counted in, the replay would add ~2 s after
    every predicted step."""
    path = str(tmp_path / "trace.duckdb")
    record(path, LIVE, jobs=[(2.0 * i, 50, 1, "chat") for i in range(20)])
    window = read_trace_window(path)
    assert len(window.requests) == 20 and window.samples.X.shape[0] == 20
    assert calibrate(window.samples).gap_s < 0.01
