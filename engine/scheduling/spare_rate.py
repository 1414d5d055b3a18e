"""The device time deferred requests actually get: prompt work (law seconds) of deferred
requests started per second while some waited (engine/lanes/admission.py defers them).

Admission's estimate of when a deferred request starts (slo_estimates.deferred_start_s) counts
the queue as it stands; it cannot see the requests that arrive later and go ahead of the
deferred ones. This rate can: measured while deferred requests wait, it is what was left
for them after everything that went first. Both sums decay with time constant TAU_S (the
default queue timeout: a deferred request's horizon) over all time, waiting or not, so an
old overload's rate fades; under MIN_WAIT_S of recent waiting it is unknown.
"""

from __future__ import annotations

import math

TAU_S = 30.0
MIN_WAIT_S = 5.0  # decayed seconds of waiting before the rate is trusted


class SpareRate:
    def __init__(self) -> None:
        self._work = 0.0  # decayed law seconds of deferred prompts started
        self._wait = 0.0  # decayed seconds during which some deferred request waited
        self._at: float | None = None  # engine clock of the last observation

    def observe(self, now: float, waited: bool, started_work: float) -> None:
        """The time since the last call (`waited`: some deferred request was queued over
        it) and the deferred prompt work started in it (law seconds)."""
        if self._at is not None and now > self._at:
            dt = now - self._at
            keep = math.exp(-dt / TAU_S)
            self._work *= keep
            self._wait = self._wait * keep + (dt if waited else 0.0)
        self._work += started_work
        self._at = now if self._at is None else max(self._at, now)

    def per_s(self) -> float | None:
        """Law seconds of deferred prompts started per second of waiting; None: unknown."""
        return self._work / self._wait if self._wait >= MIN_WAIT_S else None
