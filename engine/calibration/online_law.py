"""The step law refitted from the steps the engine serves (issue 31: one cost model,
calibrated at start-up and kept true while serving).

The start-up law (budget_fit.py) is measured on the model runner alone, on an idle machine.
Served steps cost more, and not always in the same proportions: sampling and updating add
per token, a neighbour on the memory bus makes long-context decodes dearer than prompts.
`LawSlowdown` corrects the law by one factor (measured / predicted); it cannot correct its
shape, so decode-heavy and prompt-heavy steps then miss the target in opposite directions.

Every REFIT_EVERY served steps, `OnlineLaw` fits the law's six terms over the last WINDOW
served steps (their features, step_law.py, and measured seconds) plus ANCHOR_STEPS made-up
steps (typical prompt chunks, decode batches and mixed steps) priced by the current law
times the window's median measured / predicted ratio. The anchors hold the terms the served
steps do not vary (only decodes served: the prompt terms) at the current law's, scaled as
the device is; where served steps vary, they outnumber the anchors and decide. The refit
replaces the law only if it predicts the window better than the current law rescaled by
that same median ratio does (by ADOPT_GAIN at least): a change of scale alone stays with
LawSlowdown, which never loosens budgets past the law (a faster machine is not trusted
from one window); only a change of shape swaps the law. A refit that still misses the
window by MAX_ADOPT_ERROR_PCT on average is not adopted whatever it beats: steps that
erratic (another tenant's bursts on the cores) fit no law, and the slowdown alone follows
them.

A law refitted on a slower machine stays in force after the machine is quiet again: the
slowdown cannot scale a law down, and the steps served then may all be alike (a few
streams' decodes), which the law in force, rescaled, predicts as well as any refit. Its
prompt prices stay those of the slow machine, and admission refuses as unreachable what
the quiet machine would serve in time (seen on this project's machine: a minute of 429s
after a CPU hog stopped). So while served steps run faster than the law in force (median
ratio under 1) and that law is not the start-up one, the refit anchors on the start-up
law (measured on an idle machine) scaled by the window's ratio to it (at least 1), and is
adopted when it predicts the window better than the law in force does unscaled.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from engine.calibration.step_law import StepFeatures, StepLaw, StepProbe, chunk_pairs, fit_law

WINDOW = 256  # served steps a refit looks at
REFIT_EVERY = 64  # served steps between two refits
MIN_STEPS = 64  # served steps before the first refit
ADOPT_GAIN = 0.2  # the refit's mean relative error must be at most (1 - this) x the rescale's
MAX_ADOPT_ERROR_PCT = 50.0  # a refit missing the window by more than this is not a law
# made-up steps priced by the current law: StepFeatures (tokens, decodes, prefill pairs,
# decode context)
ANCHOR_STEPS = (
    (1, 0, 1, 0),  # a prompt step's fixed cost, about
    (256, 0, chunk_pairs(0, 256), 0),  # a first prompt chunk
    (512, 0, chunk_pairs(2048, 512), 0),  # a chunk deep into a long prompt
    (272, 16, chunk_pairs(0, 256), 16 * 512),  # that first chunk beside 16 decodes
    (1, 1, 0, 128),  # a step of decodes alone: its fixed cost, about
    (16, 16, 0, 16 * 512),  # 16 decodes over 512-token contexts
    (64, 64, 0, 64 * 2048),  # 64 decodes over 2k-token contexts
)


@dataclass(frozen=True)
class Refit:
    """One refit's outcome, for the engine's gauges and the trace."""

    step: int  # the served step count when it ran
    replaced: StepLaw  # the law in force, that the refit was judged against
    law: StepLaw  # the refit law (adopted or not)
    adopted: bool
    error_pct: float  # its mean |predicted - measured| / measured over the window, %
    rescaled_error_pct: float  # the current law x the median ratio's, %
    ratio: float  # median measured / current law's prediction over the window


class OnlineLaw:
    """The served steps and the refit counts; the law in force is the scheduler's
    (SchedulerState.step_law), handed to each observation."""

    def __init__(self, startup: StepLaw | None = None) -> None:
        self.startup = startup  # the start-up law, which a law fitted on a slow machine yields to
        self.window: deque[StepProbe] = deque(maxlen=WINDOW)
        self.served = 0
        self.refits = 0  # tried
        self.adopted = 0
        self.last: Refit | None = None

    def observe(self, features: StepFeatures | None, seconds: float,
                current: StepLaw) -> Refit | None:
        """One served step's StepFeatures and measured time, under the law `current`; ->
        the refit this step ran (every REFIT_EVERY steps, to be adopted if `adopted`), else
        None."""
        if features is None or seconds <= 0:
            return None
        self.window.append(StepProbe(*features, seconds, "served"))
        self.served += 1
        if self.served < MIN_STEPS or self.served % REFIT_EVERY:
            return None
        return self.refit(current)

    def refit(self, current: StepLaw) -> Refit:
        steps = list(self.window)
        ratio = _median_ratio(current, steps)
        recovering = ratio < 1.0 and self.startup is not None and current != self.startup
        if recovering:  # anchored on the idle machine's law, scaled to the served steps
            base, scale = self.startup, max(1.0, _median_ratio(self.startup, steps))
        else:
            base, scale = current, ratio
        anchors = [StepProbe(*f, scale * base.step_s(*f), "anchor") for f in ANCHOR_STEPS]
        law = fit_law(steps + anchors)
        error = _mean_error_pct(law, steps, 1.0)
        rescaled = _mean_error_pct(current, steps, ratio)
        # the alternative to adopting: the law in force, as the slowdown can scale it
        alternative = _mean_error_pct(current, steps, 1.0) if recovering else rescaled
        adopted = error <= min((1.0 - ADOPT_GAIN) * alternative, MAX_ADOPT_ERROR_PCT)
        self.refits += 1
        self.adopted += adopted
        self.last = Refit(self.served, current, law, adopted, round(error, 2), round(rescaled, 2),
                          round(ratio, 4))
        return self.last


def _median_ratio(law: StepLaw, steps: list[StepProbe]) -> float:
    """Median measured / predicted by `law` over `steps`."""
    return statistics.median(p.seconds / max(_predict(law, p), 1e-9) for p in steps)


def _predict(law: StepLaw, p: StepProbe) -> float:
    return law.step_s(*p.features)


def _mean_error_pct(law: StepLaw, steps: list[StepProbe], scale: float) -> float:
    return 100.0 * statistics.fmean(abs(scale * _predict(law, p) - p.seconds) / p.seconds
                                    for p in steps)
