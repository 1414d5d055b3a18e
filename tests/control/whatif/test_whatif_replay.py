"""Replay: a trace recorded from a simulated engine with a known step law is predicted
back (self-prediction), deterministically, and a config change is predicted in the
direction, and near the amount, that the same workload recorded under it shows. And what
the replay assumes of each recorded request (control/whatif/replay.py's docstring): the
length it asks for, when it reaches the engine, its deadline, lane and priority."""

from __future__ import annotations

import dataclasses

import pytest
from whatif_sim_trace import START, STATIC, read_trace_window, record

from control.whatif.calibrate import StepTimeModel, calibrate
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


def _req(lane: str, outcome: str, detail: str, output_tokens: int) -> RecordedRequest:
    return RecordedRequest("run1", "r", lane, "acme", 0, outcome, detail, 100, output_tokens,
                           0, 0, START, START, None, None, None, None, None, 0.0)


def test_each_request_asks_for_its_own_length_or_its_lanes_median_as_its_outcome_says():
    """What the trace shows of each request's length (the module docstring): one that ended
    on its own (an error too) asks for what it produced; one cut short (timeout) asks for
    its lane's median of finished requests, or more if it had produced more by then; one
    refused for a full queue never showed a length and asks for the median (only a too_long
    refusal asks to be too long again); a cancelled one asks for the median of its own lane,
    not of every lane."""
    chat = [_req("chat", "finished", "length", n) for n in (10, 20, 30)]  # median 20
    batch = [_req("batch", "finished", "length", 400)]  # every lane's median: 25
    asked = [_req("chat", "error", "", 7), _req("chat", "timeout", "", 50),
             _req("chat", "timeout", "", 3), _req("chat", "rejected", "queue_full", 0),
             _req("chat", "cancelled", "", 5)]
    lengths = output_lengths(chat + batch + asked, max_model_len=2048)
    assert lengths[:4] == [10, 20, 30, 400]
    assert lengths[4:] == [7, 50, 20, 20, 20]


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> tuple[Window, StepTimeModel]:
    """Six requests a second apart (40-token prompts, 8 tokens out), each served alone, and
    the law fitted on their steps."""
    path = str(tmp_path_factory.mktemp("alone") / "trace.duckdb")
    record(path, LIVE, jobs=[(1.0 * i, 40, 8, "chat") for i in range(6)])
    window = _window(path)
    return window, calibrate(window.samples)


def _each(window: Window, **changes) -> Window:
    return dataclasses.replace(window, requests=[
        dataclasses.replace(r, **{k: v(i, r) for k, v in changes.items()})
        for i, r in enumerate(window.requests)])


def test_a_request_reaches_the_replay_after_its_recorded_tokenize_time(alone):
    """The server stamps a request's arrival, then tokenizes it; its engine sees it only
    after that. Alone, each request's predicted TTFT is longer by exactly that time."""
    window, model = alone
    config = EngineConfig(STATIC, LIVE)
    base = replay(window, config, model)
    slow = replay(_each(window, tokenize_s=lambda i, r: 0.25), config, model)
    # (abs: epoch-second clocks keep ~0.2 us)
    assert [b.ttft_s - a.ttft_s for a, b in zip(base.records, slow.records, strict=True)] \
        == pytest.approx([0.25] * 6, abs=1e-6)


def test_the_engine_loops_gap_follows_each_step_that_ran_tokens(alone):
    """The fitted gap (engine loop overhead) comes after every step: alone, a request's 8
    tokens take 8 steps, so its last token comes 7 gaps later."""
    window, model = alone
    config = EngineConfig(STATIC, LIVE)
    base = replay(window, config, dataclasses.replace(model, gap_s=0.0))
    gapped = replay(window, config, dataclasses.replace(model, gap_s=0.01))
    assert [b.e2e_s - a.e2e_s for a, b in zip(base.records, gapped.records, strict=True)] \
        == pytest.approx([0.07] * 6, abs=1e-6)


def test_a_recorded_deadline_the_replay_cannot_make_ends_its_request(alone):
    """Recorded without deadlines these requests finished (8 tokens in ~40 ms); replayed
    with their deadline 20 ms after arrival none does: the first times out while running,
    with the tokens it has, and the rest are refused at admission once a step has measured
    the throughput that says they cannot make it, as the server would."""
    window, model = alone
    config = EngineConfig(STATIC, LIVE)
    assert [r.outcome for r in replay(window, config, model).records] == ["finished"] * 6
    due = _each(window, deadline=lambda i, r: r.arrival_time + 0.02)
    records = replay(due, config, model).records
    assert [r.outcome for r in records] == ["timeout"] + ["rejected"] * 5
    assert 0 < records[0].num_output_tokens < 8
    assert [r.deadline for r in records] == [r.deadline for r in due.requests]


def test_a_replayed_request_keeps_its_lane_and_priority_and_a_removed_lane_is_routed(alone):
    """Lane and priority as recorded; "gone", a lane the config does not have, is routed as
    the server routes a request that names none (to its default lane, interactive)."""
    window, model = alone
    lanes = ("batch", "gone", "interactive")
    moved = _each(window, lane=lambda i, r: lanes[i % 3], priority=lambda i, r: i)
    records = replay(moved, EngineConfig(STATIC, LIVE), model).records
    assert [(r.lane, r.priority) for r in records] == [
        ("batch", 0), ("interactive", 1), ("interactive", 2), ("batch", 3),
        ("interactive", 4), ("interactive", 5)]
