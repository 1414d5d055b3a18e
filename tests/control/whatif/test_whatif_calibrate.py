"""Calibration: the non-negative least-squares fit recovers a known step-time law from
synthetic steps, reports its error, and warns when it is thin or asked to extrapolate."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from control.whatif.calibrate import (
    FEATURES,
    HOLDOUT_EVERY,
    MIN_STEPS,
    StepSamples,
    calibrate,
)
from engine.calibration.least_squares import nnls

# fixed, prefill, decode, context, seqs, prefill (query, key) pairs, a prompt step's extra
# fixed cost over decodes alone
LAW = np.array([0.003, 2e-5, 4e-4, 1e-7, 1.5e-4, 2e-9, 0.004])


def synthetic(n: int, seed: int = 0, noise: float = 0.01, law=LAW) -> StepSamples:
    """Steps of a mixed-batch engine: decodes with their contexts, some prefill chunks."""
    rng = np.random.default_rng(seed)
    decode = rng.integers(0, 64, n)
    prefill_seqs = rng.integers(0, 9, n)  # num_seqs differs from decode tokens only here
    chunk, start = rng.integers(16, 512, n), rng.integers(0, 4000, n)
    prefill = prefill_seqs * chunk
    pairs = prefill_seqs * (chunk * start + chunk * (chunk + 1) / 2)  # step_law.chunk_pairs
    context = decode * rng.integers(50, 4000, n)
    X = np.column_stack([np.ones(n), prefill, decode, context, decode + prefill_seqs, pairs,
                         prefill_seqs > 0])
    y = X @ law * (1 + noise * rng.standard_normal(n))
    return StepSamples(X.astype(float), y, gaps=np.full(n - 1, 0.0007), group="test")


def test_the_fit_recovers_a_known_law_and_reports_its_error():
    model = calibrate(synthetic(2000))
    # decode tokens and sequences move together (a decode is one of each): their sum is
    # what the steps pin down best; each alone only through the prefill sequences
    assert np.allclose(model.coef[:4:3], LAW[:4:3], rtol=0.05), model.coef
    assert model.coef[1] == pytest.approx(LAW[1], rel=0.05)
    assert model.coef[2] + model.coef[4] == pytest.approx(LAW[2] + LAW[4], rel=0.03)
    assert np.allclose(model.coef, LAW, rtol=0.15), model.coef
    assert model.in_sample.r2 > 0.99
    assert model.in_sample.median_abs_pct < 2  # 1% noise
    assert model.held_out.steps == 400 and model.held_out.median_abs_pct < 2
    assert model.gap_s == pytest.approx(0.0007)
    assert model.warnings == ()


def test_coefficients_stay_non_negative_where_a_term_is_absent():
    law = LAW.copy()
    law[3] = 0.0  # no context cost: ordinary least squares would go slightly negative
    model = calibrate(synthetic(1000, noise=0.05, law=law))
    assert min(model.coef) >= 0.0
    assert model.coef[3] < 2e-8
    assert model.coef[2] + model.coef[4] == pytest.approx(law[2] + law[4], rel=0.05)


def test_nnls_matches_the_unconstrained_solution_when_it_is_feasible():
    rng = np.random.default_rng(3)
    A = rng.random((50, 4))
    x = np.array([1.0, 2.0, 0.5, 3.0])
    assert np.allclose(nnls(A, A @ x), x, atol=1e-8)
    assert np.all(nnls(A, -(A @ x)) == 0.0)  # every direction would need a negative


def test_nnls_takes_a_coefficient_stepped_back_to_zero_out_of_the_fit():
    """A problem whose fit steps a coefficient back to 0 (Lawson-Hanson's inner loop): that
    feature leaves the active set. Kept in it, the next step back is by 0, forever: the
    start-up's calibration would hang (run on a thread here, so a hang fails the test)."""
    rng = np.random.default_rng(3)
    A, b = rng.random((6, 3)), rng.standard_normal(6)
    done: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: done.append(nnls(A, b)), daemon=True)
    worker.start()
    worker.join(10)
    assert done, "nnls did not return"
    x, gradient = done[0], A.T @ (b - A @ done[0])
    # the optimum (Karush-Kuhn-Tucker): no gradient along a coefficient in the fit, and none
    # that would lower the error along one held at 0
    assert (x >= 0).all() and x[1] > 0 and x[0] == x[2] == 0
    assert abs(gradient[1]) < 1e-9 and (gradient[[0, 2]] <= 1e-9).all()


def test_few_steps_are_said_plainly():
    model = calibrate(synthetic(MIN_STEPS - 20))
    assert any(f"only {MIN_STEPS - 20} steps" in w for w in model.warnings)


def test_a_step_beyond_what_the_fit_saw_is_flagged():
    model = calibrate(synthetic(500))
    seen = model.seen_max
    assert not model.beyond_seen(seen)
    assert model.beyond_seen((1.0, seen[1] * 2, 1, 1, 1, 1, 1))  # a prefill twice the largest
    assert model.beyond_seen((1.0, 1, 1, 1, seen[4] + 10, 1, 1))  # more sequences than ever
    assert model.beyond_seen((1.0, 1, 1, 1, 1, seen[5] * 2, 1))  # a chunk far deeper


def test_no_steps_is_an_error_an_operator_can_act_on():
    with pytest.raises(ValueError, match="no step that ran tokens"):
        calibrate(StepSamples(np.zeros((0, len(FEATURES))), np.zeros(0)))


def test_a_step_of_decodes_alone_has_its_own_fixed_cost():
    """Decodes alone run other code than a prompt step (on CPU the native decode layers):
    the fit tells their fixed cost from a prompt step's, where one fixed cost for both
    could only split the difference."""
    model = calibrate(synthetic(2000))
    assert model.coef[0] == pytest.approx(LAW[0], rel=0.05)  # decodes alone
    assert model.coef[0] + model.coef[-1] == pytest.approx(LAW[0] + LAW[-1], rel=0.05)
    decodes_alone = model.step_s(0, 16, 16 * 500, 16)
    assert decodes_alone == pytest.approx(LAW[0] + 16 * (LAW[2] + LAW[4]) + 16 * 500 * LAW[3],
                                          rel=0.05)
    with_a_chunk = model.step_s(64, 16, 16 * 500, 17, 64 * 65 // 2)
    assert with_a_chunk - decodes_alone == pytest.approx(
        LAW[-1] + 64 * LAW[1] + LAW[4] + 64 * 65 // 2 * LAW[5], rel=0.05)


def test_the_held_out_error_is_of_a_fit_that_never_saw_those_steps():
    """A cost only the held-out steps show (deep prompt chunks) is unknown to the fit that
    left them out: its error on them says the law does not carry over. Scored with the
    fit on every step instead, they look as well predicted as the rest."""
    samples = synthetic(1000, noise=0.0)
    X = samples.X.copy()
    held = np.arange(len(X)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    X[~held, 5] = 0.0  # prefill pairs on the held-out steps alone
    model = calibrate(StepSamples(X, X @ LAW, samples.gaps, "test"))
    assert model.in_sample.median_abs_pct < 0.1
    assert model.held_out.steps == 200 and model.held_out.median_abs_pct > 2
