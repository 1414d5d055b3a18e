"""Grammar compiles off the caller's thread, bounded: at most `capacity` run at once, each on
its own daemon thread, one per distinct key (a model's cache and a schema).

xgrammar compiles in C++ with the GIL released, and nothing in Python can interrupt it: a
caller that stops waiting (the server's compile timeout) leaves the compile running, and it
keeps its slot until it returns. So:

    slot   = one compile running, not one caller waiting: a runaway holds one slot, no more;
             a full set refuses at once (CompilesBusy) rather than queueing behind runaways
    key    = a compile already running for the same key is joined, not started again:
             N requests sending one runaway schema hold one slot between them
    thread = a daemon, started per compile: a runaway never delays the process's exit (a
             ThreadPoolExecutor's workers are joined at exit), and no queue sits behind it

Invariant (under `_lock`): `len(_running) <= capacity`, and `_running[key]` is the future of
the one thread compiling `key`, removed by that thread as it finishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class CompilesBusy(Exception):
    """Every slot is running a compile of another key."""


@dataclass
class CompileCounts:
    """Counts since start, for an operator: compiles started, requests that joined one
    already running, refused for lack of a slot, and given up at the caller's timeout
    (`abandoned`: distinct compiles among those, `abandoned_running`: still running)."""

    started: int = 0
    joined: int = 0
    refused_busy: int = 0
    timed_out: int = 0
    abandoned: int = 0
    abandoned_running: int = 0


@dataclass
class _Job:
    future: Future
    started_at: float  # time.monotonic()
    abandoned: bool = False


class CompileSlots:
    """At most `capacity` compiles at once, each on its own daemon thread (see the module)."""

    def __init__(self, capacity: int, thread_name: str = "grammar-compile"):
        if capacity < 1:
            raise ValueError(f"{capacity=} must be >= 1")
        self.capacity = capacity
        self.thread_name = thread_name
        self.counts = CompileCounts()
        self._lock = threading.Lock()
        self._running: dict[Hashable, _Job] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    def submit(self, key: Hashable, fn: Callable[[], Any]) -> Future:
        """The future of `fn()` run for `key`: the running one when `key` is compiling, else a
        new thread's. Raises CompilesBusy when all slots run other keys."""
        with self._lock:
            job = self._running.get(key)
            if job is not None:
                self.counts.joined += 1
                return job.future
            if len(self._running) >= self.capacity:
                self.counts.refused_busy += 1
                raise CompilesBusy(f"{len(self._running)} compiles running (at most"
                                   f" {self.capacity})")
            job = self._running[key] = _Job(Future(), time.monotonic())
            self.counts.started += 1
        # running before it is handed out: no caller can cancel it (the thread sets it)
        job.future.set_running_or_notify_cancel()
        threading.Thread(target=self._run, args=(key, job, fn), name=self.thread_name,
                         daemon=True).start()
        return job.future

    def abandon(self, future: Future) -> None:
        """A caller gave up waiting for `future` (its timeout): counted; the compile runs on,
        and logs how long it took when it ends."""
        with self._lock:
            self.counts.timed_out += 1
            job = next((j for j in self._running.values() if j.future is future), None)
            if job is not None and not job.abandoned:
                job.abandoned = True
                self.counts.abandoned += 1
                self.counts.abandoned_running += 1

    def _run(self, key: Hashable, job: _Job, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome: tuple[str, Any] = ("exception", exc)
        else:
            outcome = ("result", result)
        finally:  # the slot frees before the caller hears: a retry at once finds it free
            with self._lock:
                del self._running[key]
                if job.abandoned:
                    self.counts.abandoned_running -= 1
        if job.abandoned:
            log.warning("a grammar compile abandoned at its timeout ended after %.1f s"
                        " (%s)", time.monotonic() - job.started_at, outcome[0])
        if outcome[0] == "result":
            job.future.set_result(outcome[1])
        else:
            job.future.set_exception(outcome[1])
