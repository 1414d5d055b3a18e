"""A step-time law fitted to the trace's own steps (non-negative least squares of each step's
relative error).

    step_s ~= fixed_s + prefill_s * prefill_tokens + decode_s * decode_tokens
              + context_s * decode_context_tokens + seq_s * num_seqs
              + pair_s * prefill_pairs + prompt_step_s * [the step has a prompt chunk]

`decode_context_tokens` is the KV the step's decodes attend to (each decode's tokens so far,
derived from the trace: cached prompt + every token it ran up to that step).
`prefill_pairs` are the (query, key) pairs of the step's prefill chunks' attention, as the
scheduler's own law counts them (engine/calibration/step_law.py, `chunk_pairs`): a chunk
deep into a long document costs more per token than a chat's first chunk, quadratically.
`prompt_step` (1 for a step with a prompt chunk, 0 for decodes alone): a step of decodes
alone runs other code (on CPU the native decode layers), whose fixed cost is not a prompt
step's (SmolLM2 here: 14-16 ms against 20-37); the scheduler's law has its own fixed cost
for such steps too. The two laws share those terms; this one is fitted to the trace's
steps, that one to the start-up probe, and the drift watch compares served steps with the
latter. The target is the engine clock's span of a step (`end_time - start_time`: schedule
+ execute), the clock every latency is measured on; `gap_s` (the median time from a step's
end to the next start while requests were left: update, emitting, the engine loop) is added
per step by replay.

    model = calibrate(samples)       # StepSamples: one row per step that ran tokens
    model.predict(np.array([[1, 64, 3, 900, 4, 2080, 1]]))  # rows of FEATURES -> seconds

Every fit reports its error (R^2, median and p90 absolute % error in sample and on held-out
steps: every HOLDOUT_EVERY-th step, left out of a second fit) and says plainly when it is
thin (under MIN_STEPS steps) or when a replay asks for steps larger than any it has seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.calibration.least_squares import fit_nonnegative

FEATURES = ("fixed", "prefill_tokens", "decode_tokens", "decode_context_tokens", "num_seqs",
            "prefill_pairs", "prompt_step")
MIN_STEPS = 50  # fewer: the fit is reported as unreliable
HOLDOUT_EVERY = 5  # every 5th step is held out for the leave-out error
MIN_STEP_S = 1e-4  # a step's time floor in the relative fit's weights (seconds)


@dataclass(frozen=True)
class StepSamples:
    """Calibration rows: X is (n, len(FEATURES)) with a leading column of ones; y is the
    engine-clock span of each step (s); gaps: step end -> next start, busy engine only."""

    X: np.ndarray  # (n, len(FEATURES)) float64
    y: np.ndarray  # (n,) seconds
    gaps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (m,) seconds
    group: str = ""  # "model=... device=..." the steps came from

    def __post_init__(self) -> None:
        if self.X.ndim != 2 or self.X.shape[1] != len(FEATURES):
            raise ValueError(f"X.shape={self.X.shape} must be (n, {len(FEATURES)})")
        if self.y.shape != (self.X.shape[0],):
            raise ValueError(f"y.shape={self.y.shape} must be ({self.X.shape[0]},)")


@dataclass(frozen=True)
class FitError:
    r2: float | None
    median_abs_pct: float | None  # |predicted - measured| / measured, in %
    p90_abs_pct: float | None
    steps: int


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per step from its composition; `seen_max`: the largest value of each
    feature the fit saw (a replay step beyond it is an extrapolation)."""

    coef: tuple[float, ...]  # one per FEATURES, seconds per unit, all >= 0
    gap_s: float  # added after each step that ran tokens (engine loop overhead)
    seen_max: tuple[float, ...]  # per FEATURES
    in_sample: FitError
    held_out: FitError
    group: str = ""
    warnings: tuple[str, ...] = ()

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(n, len(FEATURES)) rows of FEATURES -> (n,) seconds."""
        return X @ np.asarray(self.coef)

    def step_s(self, prefill: int, decode: int, context: int, seqs: int,
               pairs: int = 0) -> float:
        c = self.coef
        return (c[0] + c[1] * prefill + c[2] * decode + c[3] * context + c[4] * seqs
                + c[5] * pairs + c[6] * (prefill > 0))

    def beyond_seen(self, row: tuple[float, ...]) -> bool:
        """True when a step is larger than every step of the fit in some feature
        (5% slack: the largest steps seen are where the law is best known)."""
        return any(v > 1.05 * m for v, m in zip(row[1:], self.seen_max[1:], strict=True))

    def to_dict(self) -> dict:
        return {"group": self.group,
                "coef_s": dict(zip(FEATURES, self.coef, strict=True)),
                "gap_s": self.gap_s,
                "seen_max": dict(zip(FEATURES[1:], self.seen_max[1:], strict=True)),
                "in_sample": self.in_sample.__dict__, "held_out": self.held_out.__dict__,
                "warnings": list(self.warnings)}


def _error(pred: np.ndarray, y: np.ndarray) -> FitError:
    if len(y) == 0:
        return FitError(None, None, None, 0)
    resid = y - pred
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / total if total > 0 else None
    pct = np.abs(resid) / np.maximum(y, 1e-9) * 100.0
    return FitError(r2, float(np.median(pct)), float(np.percentile(pct, 90)), len(y))


def _fit_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS of each step's relative error (rows scaled by 1 / its time), not its error in
    seconds: a plain fit is ruled by the long prefill steps and let the fixed cost take
    what they left, which overestimated small decode steps 1.8x on a served trace (its
    replay's TPOT came out +65%); weighted, those steps are within 4% and the long ones
    as before (bench/RESULTS.md, "The fit to each step's relative error")."""
    weight = 1.0 / np.maximum(y, MIN_STEP_S)
    return fit_nonnegative(X * weight[:, None], y * weight)


def calibrate(samples: StepSamples) -> StepTimeModel:
    """Fit the step-time law; raises ValueError when there is no step to fit."""
    X, y = samples.X, samples.y
    if len(y) == 0:
        raise ValueError("the trace has no step that ran tokens to calibrate on: widen"
                         " --since/--until, or record some traffic first")
    warnings = []
    if len(y) < MIN_STEPS:
        warnings.append(f"only {len(y)} steps to calibrate on (fewer than {MIN_STEPS}): the"
                        " step-time law, and every prediction from it, is unreliable")
    coef = _fit_relative(X, y)
    held = np.arange(len(y)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    if held.any() and (~held).sum() >= len(FEATURES):
        held_out = _error(_fit_relative(X[~held], y[~held]) @ X[held].T, y[held])
    else:
        held_out = FitError(None, None, None, 0)
    in_sample = _error(X @ coef, y)
    if in_sample.median_abs_pct is not None and in_sample.median_abs_pct > 25:
        warnings.append(f"the step-time law misses the median step by"
                        f" {in_sample.median_abs_pct:.0f}%: steps vary with something the"
                        " trace does not show (other load on the machine?)")
    gap = float(np.median(samples.gaps)) if len(samples.gaps) else 0.0
    return StepTimeModel(tuple(float(c) for c in coef), gap,
                         tuple(float(v) for v in X.max(axis=0)), in_sample, held_out,
                         samples.group, tuple(warnings))
