"""The replay's fast paths change no prediction: the light step (control/whatif/lean.py)
against Engine.step, the prefix cache left off where no request can hit it, replays in
parallel processes, and the calibration's QR-reduced fit against the direct one."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from whatif_sim_trace import STATIC, record

from control.trace.store import open_read_only
from control.whatif.calibrate import calibrate
from control.whatif.replay import Prediction, _run, replay
from control.whatif.replay_many import replays
from control.whatif.window import Window, read_window
from engine.calibration.least_squares import fit_nonnegative as _fit
from engine.calibration.least_squares import nnls
from engine.config import EngineConfig, LiveConfig

LIVE = LiveConfig(max_num_seqs=16, max_num_batched_tokens=256, prefill_chunk_size=128)
TIGHT_KV = dataclasses.replace(STATIC, num_kv_blocks=40)  # 640 tokens for 16 sequences


@pytest.fixture(scope="module")
def window(tmp_path_factory) -> Window:
    path = str(tmp_path_factory.mktemp("speed") / "trace.duckdb")
    record(path, LIVE, n=120, rate_per_s=9.0, cancel_every=10)
    con = open_read_only(path)
    try:
        return read_window(con, None, None)
    finally:
        con.close()


def _no_hits(window: Window) -> Window:
    return dataclasses.replace(window, requests=[
        dataclasses.replace(r, num_cached_tokens=0) for r in window.requests])


def _same(a: Prediction, b: Prediction) -> None:
    assert a.records == b.records  # every request's outcome, lengths and token times
    assert (a.steps, a.kv_peak_blocks, a.preempted, a.sim_seconds, a.beyond_seen_steps,
            a.largest_step) == (b.steps, b.kv_peak_blocks, b.preempted, b.sim_seconds,
                                b.beyond_seen_steps, b.largest_step)


CONFIGS = {"recorded": EngineConfig(STATIC, LIVE),
           "tight_kv": EngineConfig(TIGHT_KV, LIVE),
           "static": EngineConfig(STATIC, LIVE.replace(batching="static"))}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("hits", [True, False])
def test_light_step_replays_what_engine_step_does(window, name, hits):
    w = window if hits else _no_hits(window)
    model = calibrate(w.samples)
    lean = replay(w, CONFIGS[name], model)
    _same(lean, replay(w, CONFIGS[name], model, lean=False))
    outcomes = {r.status for r in lean.records}
    assert {"CANCELLED", "LENGTH"} <= outcomes, outcomes
    if name == "tight_kv":
        assert lean.preempted > 0  # the preemption path ran


@pytest.mark.parametrize("name", ["recorded", "tight_kv"])
def test_prefix_cache_left_off_without_hits_changes_nothing(window, name):
    """Without hits in the trace a replay runs with the cache off, and starts over with it
    on at the first preemption: the same prediction as a replay with the cache on."""
    w = _no_hits(window)
    model = calibrate(w.samples)
    config = CONFIGS[name]
    assert config.static.enable_prefix_caching
    fast = replay(w, config, model)
    _same(fast, _run(w, config, model, "", False, True, 0.0))
    assert (fast.preempted > 0) == (name == "tight_kv")


def test_parallel_replays_match_sequential(window):
    model = calibrate(window.samples)
    configs = {"a": CONFIGS["recorded"], "b": CONFIGS["tight_kv"]}
    one, two = replays(window, model, configs), replays(window, model, configs, workers=2)
    assert list(one) == list(two)
    for name in configs:
        _same(one[name], two[name])


def test_parallel_replays_on_a_fleet_replay_on_the_fleet(window):
    """--workers 2 with --replicas 2: each config on two replicas, as in one process (a
    fleet whose replicas split the load preempts less than one replica given all of it)."""
    model = calibrate(window.samples)
    configs = {"a": CONFIGS["tight_kv"], "b": CONFIGS["recorded"]}
    one = replays(window, model, configs, replicas=2)
    two = replays(window, model, configs, workers=2, replicas=2)
    single = replays(window, model, {"a": CONFIGS["tight_kv"]})["a"]
    assert one["a"].preempted != single.preempted
    for name in configs:
        assert two[name].records == one[name].records
        assert two[name].preempted == one[name].preempted


@pytest.mark.parametrize("law", [(0.004, 2e-5, 3e-4, 1e-8, 1e-4), (0.004, 2e-5, 0.0, 0.0, 3e-4)])
def test_qr_reduced_fit_equals_the_direct_fit(law):
    """NNLS on R of X = QR has the solution NNLS on X's rows has (a bound-active law too:
    the noise pushes the zero coefficients below 0, where the bound holds them)."""
    rng = np.random.default_rng(0)
    n = 20_000
    X = np.column_stack([np.ones(n), rng.integers(0, 2048, n) * (rng.random(n) < 0.3),
                         rng.integers(1, 64, n), rng.integers(0, 200_000, n),
                         rng.integers(1, 64, n)]).astype(float)
    y = X @ np.array(law) * rng.lognormal(0.0, 0.2, n)
    scale = np.abs(X).max(axis=0)
    direct = nnls(X / scale, y) / scale
    np.testing.assert_allclose(_fit(X, y), direct, rtol=1e-9, atol=1e-15)
    assert (_fit(X, y) >= 0).all()


def test_cli_jobs_replays_side_by_side_with_the_same_answer(tmp_path, capsys):
    """`--jobs 2` gives the JSON `--jobs 1` gives (but the wall times); `--jobs 0` is a
    usage error."""
    from control.cli.main import main

    db = str(tmp_path / "trace.duckdb")
    record(db, LIVE, n=60, rate_per_s=9.0)
    out = []
    for jobs in ("1", "2"):
        assert main(["whatif", "--db", db, "--set", "max_num_seqs=4", "--json",
                     "--jobs", jobs]) == 0
        result = json.loads(capsys.readouterr().out)
        for replay_info in result["replays"].values():
            replay_info.pop("wall_s")
        out.append(result)
    assert out[0] == out[1]
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=4", "--jobs", "0"]) == 2
    assert "--jobs=0 must be >= 1" in capsys.readouterr().err
