"""A server whose steps were held to target_step_ms by its start-up step law
(engine/scheduling/step_time.py) is replayed under the same law: the law travels in the trace's run
settings (TraceWriter.note_run), and without it the replay would predict another run."""

from __future__ import annotations

import dataclasses
import json

import pytest
from whatif_sim_trace import STATIC, read_trace_window, record

from control.whatif.compare import PREDICTED, RECORDED
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
def timed(tmp_path_factory) -> Window:
    path = str(tmp_path_factory.mktemp("timed") / "trace.duckdb")
    record(path, LIVE, n=150, rate_per_s=9.0, static=TIMED, step_law=LAW)
    return _window(path)


def test_the_run_settings_carry_the_law_and_the_window_reads_it_back(timed):
    assert dataclasses.astuple(timed.step_law) == pytest.approx(dataclasses.astuple(LAW))
    assert timed.run_settings["target_step_ms"] == 40
    assert any("start-up step law" in note for note in timed.notes)


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
