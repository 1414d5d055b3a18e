"""Whether served steps still cost what the start-up step law says: drift of the device.

The law (step_law.py) is measured once, at start-up. Another tenant on the machine, thermal
throttling or a driver update change what a step costs afterwards; the scheduler's
measured/predicted correction (engine/scheduling/step_time.py, `LawSlowdown`) follows such
a change within ~20 steps, so budgets stay honest, but nobody would know the device got
slower. This watch says so:

    ratio(step)  = measured / predicted seconds, for steps the law predicted
    bucket(step) = the predicted time's power of two (0.5-1 ms, 1-2 ms, ..., 0.5-1 s)
    baseline[b]  = median ratio of the first BASELINE_STEPS steps of bucket b, after the
                   first WARMUP_STEPS steps of all
    drift        = median over the steps ended in the last WINDOW_S, of those whose
                   bucket has its baseline, of ratio / baseline[bucket]

A served step also schedules, samples and updates, which the law (the model's execute,
timed on an idle machine) leaves out: ~1.1x the law on this CPU for the default model,
several times it for a tiny model's sub-millisecond steps. That share depends on the
step's size, so a step is compared with steps of its own size as the server first served
them, and a change of traffic (long prompts after short chats) does not read as drift.
`drift` is None while fewer than MIN_WINDOW_STEPS steps with a baseline ended in the
window (a new server, an idle one: no evidence either way). 1.0 is the device as it
served its first steps; 2.0 is every step taking twice as long as then. Where the
threshold is, is the operator's: the alert rule (grafana/alerts.yml) and the go-live
checklist (`step_cost_steady`) hold it, not the engine. A server that started on a busy
machine takes that as its normal. Times are on the engine clock (simulated in simulations).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

WARMUP_STEPS = 10  # first steps warm caches and allocators: not the device's normal
BASELINE_STEPS = 20  # of each bucket
WINDOW_S = 20.0
MIN_WINDOW_STEPS = 10
MAX_WINDOW_STEPS = 512


@dataclass(frozen=True)
class StepCostDrift:
    """The watch's reading at one moment (what the metrics show)."""

    drift: float | None  # recent median of ratio / its bucket's baseline (module docstring)
    window_steps: int  # steps with a baseline ended in the last WINDOW_S
    law_scale: float  # what the scheduler divides the step target by (LawSlowdown)
    law_refits: int = 0  # online refits of the law tried (engine/calibration/online_law.py)
    law_adopted: int = 0  # of them, those that replaced the law
    # a CPU model's step threads now, and how often they changed (thread_governor.py);
    # None: not governed (a GPU, one thread, a simulation)
    threads: int | None = None
    thread_switches: int = 0


class StepCostWatch:
    def __init__(self) -> None:
        self._seen = 0
        self._first: dict[int, list[float]] = {}  # bucket -> ratios, until its baseline
        self.baselines: dict[int, float] = {}
        # (end time, ratio / baseline), by time; capped so a reading stays cheap at
        # hundreds of steps a second
        self._window: deque[tuple[float, float]] = deque(maxlen=MAX_WINDOW_STEPS)

    def observe(self, end: float, predicted_s: float | None, measured_s: float,
                ) -> float | None:
        """One served step that ended at `end` (engine clock); ignored without a law.
        Its ratio over its bucket's baseline (what the drift is the median of), once the
        bucket has one; else None."""
        if predicted_s is None or predicted_s <= 0 or measured_s <= 0:
            return None
        self._seen += 1
        if self._seen <= WARMUP_STEPS:
            return None
        ratio = measured_s / predicted_s
        bucket = math.frexp(predicted_s)[1]  # predicted_s in [2^(b-1), 2^b)
        baseline = self.baselines.get(bucket)
        if baseline is None:
            first = self._first.setdefault(bucket, [])
            first.append(ratio)
            if len(first) == BASELINE_STEPS:
                self.baselines[bucket] = statistics.median(first)
                del self._first[bucket]
            return None
        self._window.append((end, ratio / baseline))
        self._trim(end)
        return ratio / baseline

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - WINDOW_S:
            self._window.popleft()

    def reading(self, now: float, law_scale: float, refits: tuple[int, int] = (0, 0),
                ) -> StepCostDrift:
        """`refits`: the online law's (tried, adopted)."""
        self._trim(now)
        steps = len(self._window)
        drift = (statistics.median(r for _, r in self._window)
                 if steps >= MIN_WINDOW_STEPS else None)
        return StepCostDrift(drift, steps, law_scale, *refits)
