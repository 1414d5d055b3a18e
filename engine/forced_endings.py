"""Who the engine ends outside `update()`, and with what detail.

Two policies decide; the engine's own methods end the requests (`Engine._finish`,
`_end_with_error`), so its bookkeeping of ended requests (final delta, record) stays in
one place:

- At the start of a step, `timeouts_due`: queued requests never scheduled by their queue
  timeout (the lane's, else the global one) or their deadline, then started requests past
  their deadline (`engine/deadlines.py`), which end with the tokens they have. All end as
  TIMEOUT.
- After a failed step, `contain_failure`: the parts that run when retried are applied,
  and every request of each part that still fails (`engine/step_faults.py` finds them)
  ends with ERROR, detail naming the phase and the exception's type; the step's
  `StepFailure` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from engine.records import SchedulerOutput
from engine.request import Request, RequestStatus
from engine.step_faults import StepFailure, Update, contain, failure_detail, part_requests

if TYPE_CHECKING:
    from engine.scheduler import Scheduler


def timeouts_due(sched: Scheduler, now: float) -> Iterator[tuple[Request, str]]:
    """(request, finish detail) of each request to end as TIMEOUT at `now`.

    NOTE: lazy on purpose: the caller ends each request before the next is looked up, and
    the started requests' deadlines are read only after every queue has been swept (a
    request ended by now is skipped there)."""
    default_s = sched.live.queue_timeout_ms / 1000.0
    for lane in sched.lanes:
        timeout_ms = lane.config.queue_timeout_ms
        timeout_s = timeout_ms / 1000.0 if timeout_ms is not None else default_s
        for req in lane.expired(now, timeout_s):
            passed = req.deadline is not None and req.deadline < now
            yield req, "deadline passed while queued" if passed else "queue timeout"
    for req in sched.deadlines.due(now):
        where = "running" if req.status is RequestStatus.RUNNING else "queued"
        yield req, f"deadline passed while {where}"


def contain_failure(execute: Callable[[SchedulerOutput], list[int]], update: Update,
                    out: SchedulerOutput, phase: str, exc: Exception, max_extra_runs: int,
                    now: float, end_with_error: Callable[[Request, float, str], None],
                    ) -> tuple[list[Request], list[Request], list[int], StepFailure]:
    """`phase` of step `out` raised `exc`: apply what ran (engine/step_faults.py), end the
    failed parts' requests through `end_with_error(req, now, detail)`, in batch order.
    Returns what update() returned for the parts that ran (rows, finished), their sampled
    tokens, and the step's StepFailure (the first failing part's phase and error)."""
    c = contain(execute, update, out, phase, exc, max_extra_runs, now)
    ended: list[str] = []
    for part, part_phase, error in c.failed:
        detail = failure_detail(part_phase, error)
        for req in part_requests(part):
            end_with_error(req, now, detail)
            ended.append(req.request_id)
    # every part ran when retried (a transient fault): nothing ended, still reported
    _, first_phase, first_error = c.failed[0] if c.failed else (out, phase, exc)
    return c.rows, c.finished, c.sampled, StepFailure(
        out.step_id, first_phase, first_error, tuple(ended), c.num_succeeded)
