"""The benchmarks' smoke runs (and gpu_check.sh's dry run), run PARALLEL at a time as soon
as the session's first one is asked for: most of their time is waiting (Ray and servers
starting, clients pacing), and one after the other they took 400 of CI's 900 seconds.
Their checks are correctness, never speed, so a neighbour's load changes no verdict. The
Ray ones run one at a time (one local Ray each)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

PARALLEL = 2
# one at a time: each Ray smoke starts a Ray of its own, and the fleet_control smoke failed
# once beside the dry run (Triton's interpreter, a core's worth of CPU for 40 s)
EXCLUSIVE = {"smoke:fleet_scaling": "ray", "smoke:fleet_control": "ray",
             "smoke:fleet_autoscale": "ray", "gpu_check_dry_run": "ray"}
LONGEST_FIRST = ["smoke:fleet_scaling", "smoke:fleet_autoscale", "smoke:hostile_traffic",
                 "gpu_check_dry_run", "smoke:whatif_accuracy", "smoke:fleet_control",
                 "smoke:tuning_sweep", "smoke:latency_reconcile", "smoke:loadtest_goals",
                 "smoke:step_cost_drift"]
WAIT_S = 900.0


class SmokePool:
    """Runs `jobs` (name -> a call) PARALLEL at a time, longest first, at most one per
    EXCLUSIVE group at once; `result(name)` waits for one (re-raising its failure)."""

    def __init__(self, jobs: dict[str, Callable[[], Any]]):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        self._jobs = jobs
        self._todo = sorted(jobs, key=lambda n: (rank.get(n, len(rank)), n))
        self._futures: dict[str, Future] = {name: Future() for name in jobs}
        self._busy: set[str] = set()
        self.seconds: dict[str, float] = {}  # each finished job's wall time, for the summary
        self._lock = threading.Condition()
        for _ in range(min(PARALLEL, len(jobs))):
            threading.Thread(target=self._work, daemon=True).start()

    def _next(self) -> str | None:
        with self._lock:
            while self._todo:
                free = [n for n in self._todo if EXCLUSIVE.get(n) not in self._busy]
                if free:
                    self._todo.remove(free[0])
                    if free[0] in EXCLUSIVE:
                        self._busy.add(EXCLUSIVE[free[0]])
                    return free[0]
                self._lock.wait()
            return None

    def _work(self) -> None:
        while (name := self._next()) is not None:
            start = time.monotonic()
            try:
                self._futures[name].set_result(self._jobs[name]())
            except BaseException as exc:  # the test that asks for `name` re-raises it
                self._futures[name].set_exception(exc)
            finally:
                self.seconds[name] = time.monotonic() - start
                with self._lock:
                    self._busy.discard(EXCLUSIVE.get(name))
                    self._lock.notify_all()

    def result(self, name: str) -> Any:
        return self._futures[name].result(timeout=WAIT_S)

    def close(self) -> None:
        """Start no more jobs (the session ended, e.g. stopped at a failure before asking
        for them); the running ones end under their own timeouts."""
        with self._lock:
            self._todo.clear()
            self._lock.notify_all()
