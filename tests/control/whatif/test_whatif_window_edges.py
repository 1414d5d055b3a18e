"""The what-if's window, calibration and capacity sweep where their own tests do not look:
a request's inter-token gaps are its decodes', calibration reads the latest steps, a
window of two runs replays the larger; a zero-second step, one long loop pause, and steps
of very different lengths in the fit; a scaled deadline, a capacity row's goodput share,
and the sweep's capacity read from the lowest rate up."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from whatif_sim_trace import read_trace_window, record

from control.whatif import capacity
from control.whatif import window as window_module
from control.whatif.calibrate import FEATURES, MIN_STEPS, StepSamples, calibrate
from control.whatif.capacity import capacity_row, scale_window, sweep
from control.whatif.window import RecordedRequest, Window
from engine.config import LiveConfig


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """60 requests on a KV pool large enough that none is preempted; prompts over 128
    tokens run in several chunks."""
    path = str(tmp_path_factory.mktemp("window-edges") / "trace.duckdb")
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), n=60, rate_per_s=4.0)
    return path


def test_a_requests_inter_token_gaps_are_one_per_decoded_token(db):
    """The recorded TPOT the replay is judged against: the gaps between a request's tokens,
    not between the chunks of its prompt."""
    window = read_trace_window(db)
    assert window.facts.preempted == 0
    chunked = [r for r in window.requests if r.num_prompt_tokens > 128]
    assert chunked  # some prompts ran in several chunks
    for r in window.requests:
        assert len(window.itl_s.get(r.request_id, [])) == r.num_output_tokens - 1, r


def test_calibration_reads_the_latest_steps_of_the_window(db, monkeypatch):
    whole = read_trace_window(db)
    monkeypatch.setattr(window_module, "CALIBRATION_MAX_STEPS", 20)
    latest = read_trace_window(db)
    assert len(whole.samples.y) > 40
    assert 0 < len(latest.samples.y) <= 20


def test_a_window_of_two_runs_replays_the_run_with_the_most_requests(db, tmp_path):
    import duckdb

    path = str(tmp_path / "two-runs.duckdb")
    shutil.copy(db, path)
    con = duckdb.connect(path)
    try:
        con.execute("UPDATE requests SET run_id = 'run0' WHERE request_id IN"
                    " ('r0', 'r1', 'r2', 'r3', 'r4')")
    finally:
        con.close()
    window = read_trace_window(path)
    assert len(window.requests) == 55
    assert {r.run_id for r in window.requests} == {"run1"}
    assert any("spans 2 server runs" in note for note in window.notes), window.notes


# ---- calibration ---------------------------------------------------------------------------

LAW = np.array([0.003, 2e-5, 4e-4, 1e-7, 1.5e-4, 2e-9, 0.004])  # as test_whatif_calibrate


def linear_steps(n: int) -> StepSamples:
    """Steps that follow LAW exactly: decodes with their contexts, every third a chunk."""
    i = np.arange(n)
    decode, chunk = 1 + i % 32, np.where(i % 3 == 0, 64 + 8 * (i % 50), 0)
    X = np.column_stack([np.ones(n), chunk, decode, decode * (100 + 7 * i), decode + (chunk > 0),
                         chunk * (chunk + 1) / 2, chunk > 0]).astype(float)
    return StepSamples(X, X @ LAW)


def test_a_step_of_zero_seconds_leaves_the_fit_finite():
    """A fake clock (or a clock's resolution) can record a step of 0 s."""
    samples = linear_steps(200)
    y = samples.y.copy()
    y[0] = 0.0
    model = calibrate(StepSamples(samples.X, y))
    assert np.isfinite(model.coef).all() and np.isfinite(model.predict(samples.X)).all()


def test_the_loop_gap_is_the_median_and_one_long_pause_does_not_move_it():
    samples = linear_steps(200)
    gaps = np.array([0.001] * 9 + [1.0])  # a GC pause between two steps
    model = calibrate(StepSamples(samples.X, samples.y, gaps))
    assert model.gap_s == pytest.approx(0.001)


def test_exactly_min_steps_are_not_said_to_be_too_few():
    assert calibrate(linear_steps(MIN_STEPS)).warnings == ()
    assert calibrate(linear_steps(MIN_STEPS - 1)).warnings != ()


def test_short_decode_steps_are_fitted_beside_long_prompt_steps():
    """Prompt steps quadratic in their length, which the linear law cannot follow: fitted
    in seconds, they pull the fixed cost down and the short decode steps come out ~25%
    off; fitted by each step's relative error, within 2%."""
    rows, y = [], []
    for d in range(1, 17):  # decodes alone: 5 ms + 0.2 ms a sequence
        for _ in range(4):
            rows.append([1, 0, d, 0, d, 0, 0])
            y.append(0.005 + 0.0002 * d)
    for p in range(256, 4097, 256):  # prompt steps, quadratic in their length
        rows.append([1, p, 0, 0, 1, 0, 1])
        y.append(0.02 + 3e-8 * p * p)
    X, y = np.array(rows, dtype=float), np.array(y)
    assert X.shape[1] == len(FEATURES)
    model = calibrate(StepSamples(X, y))
    decodes = X[:, 6] == 0
    error = np.abs(model.predict(X[decodes]) - y[decodes]) / y[decodes]
    assert np.median(error) < 0.02, model.coef


# ---- capacity ------------------------------------------------------------------------------

def recorded(rid: str, arrival: float, deadline: float | None) -> RecordedRequest:
    return RecordedRequest("run1", rid, "interactive", "t", 0, "finished", "", 100, 10, 0, 0,
                           arrival, arrival + 2.0, deadline, 0.0, 0.1, 0.01, 2.0, 0.0)


def window_of(requests: list[RecordedRequest], since: float = 0.0,
              until: float = 10.0) -> Window:
    """A window for the capacity arithmetic alone (no facts or samples are read)."""
    return Window(since, until, "m", "", {}, requests, None, {}, None)


def test_a_scaled_deadline_keeps_its_distance_from_arrival():
    """A client's deadline 5 s after it sent the request is still 5 s at twice the rate."""
    fast = scale_window(window_of([recorded("r", 8.0, 13.0), recorded("s", 4.0, None)]), 2.0)
    r, s = fast.requests
    assert (r.arrival_time, r.deadline) == (4.0, 9.0)
    assert (s.arrival_time, s.deadline) == (2.0, None)


def test_a_capacity_row_reads_goodput_as_a_share_of_the_offered_requests(monkeypatch):
    """10 requests in 10 s, 8 finished, goodput 0.6/s: 6 met their SLO, 60% of those
    offered (rejections count as offered and missed)."""
    summary = {"requests": 10, "finished": 8, "rejected": 2, "timeout": 0,
               "goodput_rps": 0.6, "ttft": {"p99": 0.3}, "e2e": {"p99": 1.0}}
    monkeypatch.setattr(capacity, "predicted_summary", lambda p, duration_s, slo: summary)
    row = capacity_row(2.0, window_of([]), None, None)
    assert row["offered_rps"] == pytest.approx(1.0)
    assert row["met_share_of_offered"] == pytest.approx(0.6)


def fake_sweep(monkeypatch, shares: dict[float, float]) -> tuple[dict, list[float]]:
    """sweep() with each (config, rate)'s replay and row replaced: the share met at each
    rate from `shares`; returns the sweep and the window span each row was read over."""
    spans: list[float] = []
    monkeypatch.setattr(capacity, "replays", lambda scaled, model, configs, *a: dict.fromkeys(
        configs))

    def row(k, window, p, slo):
        spans.append(window.duration_s)
        return {"rate_scale": k, "met_share_of_offered": shares[k]}

    monkeypatch.setattr(capacity, "capacity_row", row)
    return sweep(window_of([recorded("r", 1.0, None)]), None, {"as-is": None},
                 sorted(shares), None), spans


def test_capacity_is_the_highest_rate_up_to_which_every_rate_met_the_slo(monkeypatch):
    result, spans = fake_sweep(monkeypatch, {1.0: 0.99, 2.0: 0.9, 4.0: 0.97})
    assert result["capacity"] == {"as-is": 1.0}  # 4x met it by chance; 2x did not
    assert spans == pytest.approx([10.0, 5.0, 2.5])  # each rate over its scaled window
