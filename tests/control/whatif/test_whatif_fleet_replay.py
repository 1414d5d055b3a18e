"""The fleet replay's merged numbers (control/whatif/fleet_replay.py): its span runs to the
last request's end on whichever replica, and its KV peak is the busiest replica's, of one
replica's pool (what a watermark acts on), not the fleet's total."""

from __future__ import annotations

import pytest
from whatif_sim_trace import read_trace_window, record

from control.whatif.calibrate import calibrate
from control.whatif.capacity import scale_window
from control.whatif.configs import base_config, recorded_config
from control.whatif.fleet_replay import replay_fleet
from control.whatif.replay import replay
from engine.config import LiveConfig


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """80 requests at 8 times their recorded rate: one replica is short of KV."""
    path = str(tmp_path_factory.mktemp("fleet") / "trace.duckdb")
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), n=80, rate_per_s=4.0)
    window = read_trace_window(path)
    config, _ = recorded_config(window, base_config(window, None)[0])
    return scale_window(window, 8), config, calibrate(window.samples)


def test_the_fleet_replay_spans_until_its_last_request_ends(busy):
    window, config, model = busy
    fleet = replay_fleet(window, config, model, replicas=4)
    last_end = max(r.finished_time for r in fleet.records)
    assert fleet.sim_seconds == pytest.approx(last_end - window.since)


def test_the_fleet_kv_peak_is_the_busiest_replicas(busy):
    window, config, model = busy
    alone = replay(window, config, model)
    fleet = replay_fleet(window, config, model, replicas=4)
    assert fleet.kv_total_blocks == alone.kv_total_blocks  # one replica's pool
    # the same load over four replicas: each holds a share of what one replica held
    assert 0 < fleet.kv_peak_blocks < alone.kv_peak_blocks <= alone.kv_total_blocks


def test_a_cancel_after_the_last_arrival_still_cancels_on_the_fleet(tmp_path):
    """The last request is cancelled 0.3 s after it arrives, long before its 400 tokens are
    out: on a fleet too it ends cancelled, not finished."""
    path = str(tmp_path / "trace.duckdb")
    jobs = [(0.1 * i, 40, 8, "chat") for i in range(4)] + [(0.5, 40, 400, "chat")]
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), jobs=jobs, cancel_every=5)
    window = read_trace_window(path)
    config, _ = recorded_config(window, base_config(window, None)[0])
    assert [r.outcome for r in window.requests][-1] == "cancelled"
    fleet = replay_fleet(window, config, calibrate(window.samples), replicas=2)
    assert [(r.request_id, r.outcome) for r in fleet.records] == [
        ("w0", "finished"), ("w1", "finished"), ("w2", "finished"), ("w3", "finished"),
        ("w4", "cancelled")]
