"""Failed engine steps -> readiness, and how they are logged.

A failed step ends only the requests of the part of its batch that failed
(engine/fault_isolation.py), so one bad request does not make a replica unready. Rule:

    /readyz is 503 while the last `unready_after` steps (3) each failed whole (nothing in
    them ran) and the latest of them ended less than `hold_s` (30 s) ago.

A step in which anything ran clears it at once. So does `hold_s` without a failure: a load
balancer stops sending traffic to an unready replica, so a replica left idle could never
prove itself again; after the hold it takes traffic, and a device that is still broken
fails the next `unready_after` steps and turns it 503 again.

Written by the engine thread only; /readyz reads it (plain attributes, a consistent
enough view for a probe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from engine.engine import Engine
from engine.records import STEP_FAILED, StepFailure, StepOutput

TRACEBACK_EVERY_S = 10.0  # a run of alike failures logs one traceback per this long


class StepHealth:
    def __init__(self, unready_after: int = 3, hold_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        if unready_after < 1:
            raise ValueError(f"unready_after={unready_after!r} must be >= 1")
        if hold_s <= 0:
            raise ValueError(f"hold_s={hold_s!r} must be > 0")
        self.unready_after = unready_after
        self.hold_s = hold_s
        self.clock = clock
        self.failed_steps = 0  # since start: steps with a failure, whole or in part
        self.failed_requests = 0  # requests ended by failed steps
        self.consecutive = 0  # whole-step failures since anything last ran
        self.last_failure = ""  # its finish detail, with the step id
        self.last_failure_at: float | None = None  # monotonic seconds
        self._detail = ""  # the last failure's finish detail
        self._logged: tuple[str, float] = ("", float("-inf"))  # (detail, when) traced

    def on_success(self) -> None:
        self.consecutive = 0

    def on_failure(self, failure: StepFailure | None, detail: str, num_ended: int) -> None:
        """A step failed (`failure` None: step() itself raised; nothing ran)."""
        self.failed_steps += 1
        self.failed_requests += num_ended
        self.last_failure_at = self.clock()
        self._detail = detail
        step = f"step {failure.step_id}: " if failure is not None else ""
        self.last_failure = step + detail
        if failure is None or failure.whole_step:
            self.consecutive += 1
        else:
            self.consecutive = 0  # part of the batch ran: the engine works

    def reason(self) -> str | None:
        """Why the replica is not ready, or None."""
        if self.consecutive < self.unready_after or self.last_failure_at is None:
            return None
        age = self.clock() - self.last_failure_at
        if age >= self.hold_s:
            return None
        return (f"the last {self.consecutive} engine steps failed (latest {age:.1f}s ago,"
                f" {self.last_failure}); ready again after a step succeeds or"
                f" {self.hold_s:g}s without a failure")

    def as_dict(self) -> dict[str, object]:
        """For the /readyz body."""
        at = self.last_failure_at
        return {"failed_steps": self.failed_steps, "failed_requests": self.failed_requests,
                "consecutive": self.consecutive, "last": self.last_failure or None,
                "last_age_s": None if at is None else round(self.clock() - at, 3)}

    def log(self, log: logging.Logger, error: BaseException, message: str) -> None:
        """Log a failure with its traceback, but one traceback per TRACEBACK_EVERY_S for a
        run of alike ones (a broken device fails every step: the log must stay readable)."""
        now, kind = self.clock(), self._detail
        if self._logged[0] != kind or now - self._logged[1] >= TRACEBACK_EVERY_S:
            self._logged = (kind, now)
            log.error("%s", message, exc_info=error)
        else:
            log.error("%s (%s again; traceback logged once per %gs)", message, kind,
                      TRACEBACK_EVERY_S)

    def step_failed(self, failure: StepFailure, log: logging.Logger) -> None:
        """A step whose batch failed in part (the engine ended those requests)."""
        ended = failure.request_ids
        self.on_failure(failure, failure.detail, len(ended))
        self.log(log, failure.error, f"engine step {failure.step_id} failed in"
                 f" {failure.phase}: ended {len(ended)} requests"
                 f" ({', '.join(ended[:8])}{' ...' if len(ended) > 8 else ''}),"
                 f" {failure.num_succeeded} went on")

    def step_raised(self, engine: Engine, exc: Exception, log: logging.Logger) -> StepOutput:
        """A step that raised outside execute and update: which requests it touched is
        unknown, so every one ends (if that raises too, the engine loop dies)."""
        detail = f"{STEP_FAILED}: step raised {type(exc).__name__}"
        step = engine.fail_all(detail)
        ended = sum(1 for delta in step.ended if delta.finish_detail == detail)
        self.on_failure(None, detail, ended)
        self.log(log, exc, f"engine step failed outside execute and update; ended all"
                 f" {ended} requests")
        return step
