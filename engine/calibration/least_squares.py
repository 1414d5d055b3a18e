"""Non-negative least squares: the fit behind every step-time law (start-up and what-if).

    coef = fit_nonnegative(X, y)   # X: (n, k) feature rows, y: (n,) -> (k,) coef >= 0

A step never gets cheaper with more work, so every coefficient of a step-time law is held
at >= 0: a plain least-squares fit over noisy steps can pay for a too-steep slope with a
negative one elsewhere, and then predicts negative times for steps it has not seen.
"""

from __future__ import annotations

import numpy as np


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson-Hanson active set); A: (n, k)."""
    k = A.shape[1]
    x = np.zeros(k)
    passive = np.zeros(k, dtype=bool)
    for _ in range(max_iter):
        w = A.T @ (b - A @ x)  # gradient: the features that would lower the error
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12 * (np.abs(w).max() + 1):
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(k)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)  # step back towards x until a coefficient hits 0
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


def fit_nonnegative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS of y over the columns of X, each scaled to at most 1 first (features differ by
    orders of magnitude: one column of ones, another of millions of context tokens)."""
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0  # a feature that never varied off zero: coefficient 0
    A = X / scale
    if len(y) > 4 * A.shape[1]:
        # NOTE: with A = QR (Q: (n, k) orthonormal), ||A x - y||^2 = ||R x - Q^T y||^2 + a
        # constant, so NNLS on the (k, k) system has the same solution as on the n rows,
        # without a least-squares solve over 200k rows per active-set change.
        Q, R = np.linalg.qr(A)
        return nnls(R, Q.T @ y) / scale
    return nnls(A, y) / scale
