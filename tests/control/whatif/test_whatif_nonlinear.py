"""What-if accuracy on steps that do not follow the fit's linear law.

The traces come from the simulated engine with CPU-like step costs (engine/sim/step_cost.py:
SmolLM2-135M's measured shapes; attention quadratic in a prompt's length, decode attention
per context token, a per-sequence cost, 5% lognormal noise) on a workload whose contexts
change over the window (whatif_sim_trace.phased_workload: chat phases, then phases of long
documents). The "truth" of a proposal is the same workload recorded under it in the same
simulator; the prediction is a replay of the base trace under the proposal.

Tolerances are the project's what-if goals (bench/RESULTS.md, "What-if accuracy"): a replay
of the recorded config within 10% of the recording at p50 and 20% at p99, a proposal within
20% / 30%; throughput (output tokens per second, first arrival to last finish) within 5%.
The fit without its context term (a monkeypatch of calibrate's solver) misses them.

Measured, predicted / simulated - 1 (seed 0), with the fit's (query, key) pair term, the
form of the scheduler's own step law (engine/calibration/step_law.py), fitted to each
step's relative error (control/whatif/calibrate.py): every figure of the self-replay, the
max_num_seqs 4 and the 32-token-chunk proposals within 5.2% (within 1% when the fit was
to seconds, before 2026-12-05). Without the pair term: self TTFT p99 -54%, TPOT p99 -44%;
chunk32 TTFT p99 -48% (a chunk deep into a document cost what a chat's first chunk costs
per token). Without the context term: self TPOT p99 -45%, E2E p99 -38%.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from whatif_sim_trace import STATIC, phased_workload, read_trace_window, record

import control.whatif.calibrate as calibrate_module
from control.whatif.calibrate import calibrate
from control.whatif.replay import replay
from control.whatif.summary import predicted_summary, recorded_summary
from control.whatif.window import Window
from engine.config import EngineConfig, LiveConfig
from engine.sim.step_cost import CpuLikeStepCost

LIVE = LiveConfig(max_num_seqs=16, max_num_batched_tokens=256, prefill_chunk_size=128)
BIG = dataclasses.replace(STATIC, num_kv_blocks=3000, max_model_len=4096)  # no preemption
PROPOSALS = {"self": {}, "seqs4": {"max_num_seqs": 4},
             "chunk32": {"prefill_chunk_size": 32, "max_num_batched_tokens": 64}}
SELF_GOAL, PROPOSAL_GOAL = {"p50": 0.10, "p99": 0.20}, {"p50": 0.20, "p99": 0.30}
THROUGHPUT_GOAL = 0.05
CONTEXT = 3  # the decode-context column of calibrate.FEATURES
PAIRS = 5  # the prefill (query, key) pairs column


def record_all(tmp_path_factory, names, **cost) -> dict[str, Window]:
    """The phased workload recorded under each named proposal (seed 0 throughout)."""
    out = {}
    for name in names:
        path = str(tmp_path_factory.mktemp(name) / "trace.duckdb")
        record(path, LIVE.replace(**PROPOSALS[name]), static=BIG, jobs=phased_workload(0),
               cost_model=CpuLikeStepCost(seed=0, **cost))
        out[name] = read_trace_window(path)
    return out


@pytest.fixture(scope="module")
def truths(tmp_path_factory) -> dict[str, Window]:
    return record_all(tmp_path_factory, PROPOSALS)


def throughput(records) -> float:
    """Output tokens of finished requests per second, first arrival to last finish."""
    done = [r for r in records if r.outcome == "finished"]
    span = max(r.finished_time for r in done) - min(r.arrival_time for r in records)
    return sum(r.num_output_tokens for r in done) / span


def errors(truths: dict[str, Window], name: str) -> dict[str, float]:
    """predicted / simulated - 1 of `name`, replayed from the "self" trace's fit."""
    window = truths["self"]
    prediction = replay(window, EngineConfig(BIG, LIVE.replace(**PROPOSALS[name])),
                        calibrate(window.samples))
    pred = predicted_summary(prediction, window.duration_s, None)
    real = recorded_summary(truths[name], None)
    out = {f"{m}_{s}": pred[m][s] / real[m][s] - 1
           for m in ("ttft", "tpot", "e2e") for s in ("p50", "p99")}
    out["throughput"] = throughput(prediction.records) / throughput(truths[name].requests) - 1
    return out


def misses(errs: dict[str, float], goal: dict[str, float], stats=("p50", "p99"),
           metrics=("ttft", "tpot", "e2e")) -> dict[str, float]:
    """The errors over their goal (empty: within every goal)."""
    checked = {f"{m}_{s}": goal[s] for m in metrics for s in stats}
    checked["throughput"] = THROUGHPUT_GOAL
    return {k: round(errs[k], 3) for k, limit in checked.items() if abs(errs[k]) > limit}


def without(monkeypatch, column: int) -> None:
    """A broken fit: calibrate's solver does not see one column (its coefficient 0)."""
    solve = calibrate_module.fit_nonnegative

    def fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
        blind = X.copy()
        blind[:, column] = 0.0
        coef = solve(blind, y)
        coef[column] = 0.0
        return coef

    monkeypatch.setattr(calibrate_module, "fit_nonnegative", fit)


def test_the_fit_sees_what_the_steps_cost(truths):
    model = calibrate(truths["self"].samples)
    assert model.coef[CONTEXT] > 0  # long documents' decodes cost more per token
    assert model.coef[PAIRS] > 0  # and their deep prefill chunks, quadratically
    assert model.in_sample.median_abs_pct < 5  # down to the simulator's 5% noise


def test_fewer_sequences_is_predicted_within_the_goals(truths):
    assert misses(errors(truths, "seqs4"), PROPOSAL_GOAL) == {}


def test_prefill_heavy_predictions_are_within_the_goals(truths):
    assert misses(errors(truths, "self"), SELF_GOAL) == {}
    assert misses(errors(truths, "chunk32"), PROPOSAL_GOAL) == {}


def test_a_fit_without_its_context_term_misses_the_goals(truths, monkeypatch):
    without(monkeypatch, CONTEXT)
    assert calibrate(truths["self"].samples).coef[CONTEXT] == 0.0
    assert misses(errors(truths, "self"), SELF_GOAL, stats=("p99",), metrics=("tpot", "e2e"))


def test_a_fit_without_its_pair_term_misses_the_prefill_heavy_goals(truths, monkeypatch):
    without(monkeypatch, PAIRS)
    assert calibrate(truths["self"].samples).coef[PAIRS] == 0.0
    assert "ttft_p99" in misses(errors(truths, "self"), SELF_GOAL)
    assert "ttft_p99" in misses(errors(truths, "chunk32"), PROPOSAL_GOAL)


def test_without_the_quadratic_attention_every_prediction_is_within_two_percent(
        tmp_path_factory):
    """What the xfail above misses is the pairs term: with it zeroed in the simulator (the
    rest, noise included, as before) the same replays land within 2% at p50 and p99."""
    linear = record_all(tmp_path_factory, PROPOSALS, prefill_pair_s=0.0)
    for name in PROPOSALS:
        assert misses(errors(linear, name), {"p50": 0.02, "p99": 0.02}) == {}, name
