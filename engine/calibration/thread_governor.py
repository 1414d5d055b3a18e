"""How many threads a CPU engine's steps run on, chosen from the steps it serves.

A step's OpenMP threads meet at a barrier after every parallel operation, hundreds of times
a step. When another process takes one of the cores, the thread left on its core spins at
the barrier (libgomp spins some 300,000 rounds before it sleeps) while the one it waits for
has no core, so each barrier costs a turn of the OS scheduler. On the 2-core dev VM beside
three test runs, 16 requests took 18-21 s on 2 threads and 2.0-2.4 s on one (1.1 s on 2
threads alone). `OMP_WAIT_POLICY=PASSIVE` (sleep at once) took 1.5-2.2 s there but costs a
quiet machine a fifth of its speed or more, and libgomp reads it once, at start; the
number of threads can change between any two steps. So, from each served step's

    relative cost   measured / predicted time, over the same for steps of its size when
                    the server began (StepCostWatch, engine/calibration/drift.py)

    suspect   on all threads, the median relative cost of the last WINDOW steps is over
              SUSPECT: the next TRIAL steps run on one thread
    probe     the same trial once the first WINDOW steps are served, then every
              PROBE_EVERY_S whatever the costs: a server that started beside the other
              process took its contended steps as its start, and reads near 1
    switch    a trial's median under KEEP x the median of the WINDOW steps before it: the
              trial's thread count stays; otherwise the old one is restored, and the next
              trial waits BACKOFF_S, doubled after each failed trial up to MAX_BACKOFF_S
    back      on one thread, a trial of all threads every BACKOFF_S (the same doubling)

Trials compare steps of the same minute, so neither the law's accuracy nor the steps' sizes
decide. A step without a relative cost (no law; its size not yet seen) does not count. A
quiet server never reads over SUSPECT, so its only trials are the probes: TRIAL steps on
one thread every PROBE_EVERY_S, undone.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 16  # steps whose median decides (a step of a burst alone must not)
TRIAL = 6  # steps a trial runs: contention's cost is several-fold, not a few percent
SUSPECT = 1.5  # relative cost on all threads that starts a trial of one
KEEP = 0.8  # a trial is kept when it costs at most this share of what it replaced
BACKOFF_S = 30.0
MAX_BACKOFF_S = 600.0
PROBE_EVERY_S = 300.0  # on a quiet machine: 6 steps of 300 s run on one thread


@dataclass(frozen=True)
class ThreadSwitch:
    """A kept trial: what the operator is told."""

    threads: int  # the steps' threads from now on
    replaced: int
    before: float  # median relative cost of the last WINDOW steps on `replaced`
    after: float  # the trial's median on `threads`

    def describe(self) -> str:
        why = ("another process is on the cores" if self.threads < self.replaced
               else "the cores are free again")
        return (f"steps on {self.threads} thread(s) instead of {self.replaced}: they cost"
                f" {self.after:.2f}x their start against {self.before:.2f}x ({why})")


class ThreadGovernor:
    """`threads`: all the steps may use; `set_threads`: torch.set_num_threads (the native
    kernels read torch's count at each call)."""

    def __init__(self, threads: int, set_threads: Callable[[int], None]):
        self.all_threads = threads
        self.threads = threads  # in force outside a trial
        self.switches = 0
        self._set = set_threads
        self._recent: deque[float] = deque(maxlen=WINDOW)  # relative costs on self.threads
        self._trial: list[float] | None = None
        self._backoff_s = BACKOFF_S
        self._next_trial = 0.0  # engine clock
        self._next_probe = 0.0
        self._probing = False

    def observe(self, relative: float | None, now: float) -> ThreadSwitch | None:
        """One served step's relative cost (None: none) that ended at `now` (engine
        clock); the switch when this step ended a trial that was kept."""
        if relative is None:
            return None
        if self._trial is not None:
            self._trial.append(relative)
            return self._end_trial(now) if len(self._trial) == TRIAL else None
        self._recent.append(relative)
        if len(self._recent) < WINDOW or now < self._next_trial:
            return None
        probe = now >= self._next_probe
        if (self.threads == self.all_threads and not probe
                and statistics.median(self._recent) <= SUSPECT):
            return None
        if probe:
            self._next_probe = now + PROBE_EVERY_S
        self._probing = probe  # a probe that loses leaves the back-off as it was
        self._trial = []
        self._set(self._other())
        return None

    def _other(self) -> int:
        return 1 if self.threads == self.all_threads else self.all_threads

    def _end_trial(self, now: float) -> ThreadSwitch | None:
        after, before = statistics.median(self._trial), statistics.median(self._recent)
        self._trial = None
        if after < KEEP * before:
            switch = ThreadSwitch(self._other(), self.threads, before, after)
            self.threads = switch.threads
            self.switches += 1
            self._recent.clear()
            self._backoff_s = BACKOFF_S
            self._next_trial = now + BACKOFF_S
            return switch
        self._set(self.threads)
        if self._probing:
            return None
        self._next_trial = now + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, MAX_BACKOFF_S)
        return None
