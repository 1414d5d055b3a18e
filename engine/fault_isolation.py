"""A step that fails: find the part of the batch that fails, end only its requests.

An exception in the executor (an out-of-memory on a large prefill, a device error) or in
`Scheduler.update()` (the executor returned tokens it cannot apply) must not end every
in-flight request. The engine runs the step's batch through `execute_isolating`:

    batch [d0 d1 d2 d3 | p0 p1]  raises
      -> [d0 d1 d2]  ok: update() applies its tokens
      -> [d3 p0 p1]  raises
           -> [d3]     ok
           -> [p0 p1]  raises -> [p0] ok, [p1] raises: p1's part failed

Each part is a `SchedulerOutput` of the same step (its requests keep their order), so
`update()` applies it as it would the whole. Bisection stops after `max_extra_runs`
executor calls besides the first: a fault that fails every call (a lost device) costs a
bounded number of calls, and every part left then fails whole. One failing request among
N is found in about 2*log2(N) calls (N = 256: 16, the default).

Re-running a part is safe: the scheduler's state is not touched by execute, and the
executor writes the same KV slots again. `contain` applies the parts that ran
(`Scheduler.update`) and ends every request of each part that still fails with ERROR
(`Scheduler.end_with_error`: blocks freed, out of the running set and their lanes), detail
naming the phase and the exception's type; it returns what it did (`Contained`: the
applied rows, the ended requests, the step's `StepFailure`), and the engine does its
bookkeeping of them (final deltas, records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.records import PrefillChunk, SchedulerOutput, StepFailure, failure_detail
from engine.request import Request

if TYPE_CHECKING:
    from engine.scheduling.scheduler import Scheduler

Execute = Callable[[SchedulerOutput], list[int]]  # the executor's execute()

DEFAULT_MAX_EXTRA_RUNS = 16  # executor calls a failed step may add to find its culprits


def part_requests(out: SchedulerOutput) -> list[Request]:
    """The requests of a step (or part), decodes then prefill chunks."""
    return list(out.decodes) + [c.request for c in out.prefills]


def split(out: SchedulerOutput) -> tuple[SchedulerOutput, SchedulerOutput]:
    """Two halves of a step's work (of at least 2 requests), each a SchedulerOutput."""
    decodes, prefills = out.decodes, out.prefills
    half = (len(decodes) + len(prefills)) // 2
    first_d, first_p = decodes[:half], prefills[:max(0, half - len(decodes))]
    rest_d, rest_p = decodes[half:], prefills[len(first_p):]
    return _part(out, first_d, first_p), _part(out, rest_d, rest_p)


def _part(out: SchedulerOutput, decodes: list[Request], prefills: list[PrefillChunk],
          ) -> SchedulerOutput:
    return SchedulerOutput(out.step_id, decodes, prefills, out.config_version,
                           out.token_budget, num_decode_tokens=len(decodes),
                           num_prefill_tokens=sum(c.num_tokens for c in prefills))


def execute_isolating(execute: Execute, out: SchedulerOutput,
                      max_extra_runs: int, first_error: Exception,
                      ) -> tuple[list[tuple[SchedulerOutput, list[int]]],
                                 list[tuple[SchedulerOutput, Exception]]]:
    """`execute(out)` raised `first_error`: bisect. Returns (part, sampled tokens) for the
    parts that ran and (part, exception) for those that failed, together covering `out`
    once, each list in batch order."""
    done: list[tuple[SchedulerOutput, list[int]]] = []
    failed: list[tuple[SchedulerOutput, Exception]] = []
    pending: list[tuple[SchedulerOutput, Exception | None]] = [(out, first_error)]
    runs_left = max_extra_runs
    while pending:
        part, error = pending.pop()
        if error is None:
            try:
                done.append((part, execute(part)))
                continue
            except Exception as exc:  # any executor fault is contained
                error = exc
        if part.num_seqs > 1 and runs_left >= 2:
            runs_left -= 2
            first, second = split(part)
            pending += [(second, None), (first, None)]  # depth first: first half next
        else:
            failed.append((part, error))
    return done, failed


@dataclass
class Contained:
    """A failed step's outcome: what the parts that ran produced (as update() returns it),
    their sampled tokens, the requests ended with ERROR, and the step's StepFailure."""

    failure: StepFailure
    rows: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    ended: list[Request] = field(default_factory=list)  # with ERROR, in batch order


def contain(execute: Execute, sched: Scheduler, out: SchedulerOutput, phase: str,
            error: Exception, max_extra_runs: int, now: float) -> Contained:
    """`phase` ("execute" or "update") of the step `out` raised `error`. An execute
    failure is bisected and the parts that ran are applied (`sched.update`); an update
    failure may have applied part of the batch, so all of it fails. Every request of a
    part that fails ends with ERROR (`sched.end_with_error`), in batch order."""
    applied: list[tuple[SchedulerOutput, list[int], tuple[list[Request], list[Request]]]] = []
    failed: list[tuple[SchedulerOutput, str, Exception]] = []
    if phase != "execute":
        failed.append((out, phase, error))
    else:
        done, broken = execute_isolating(execute, out, max_extra_runs, error)
        failed += [(part, "execute", exc) for part, exc in broken]
        for part, sampled in done:
            try:
                applied.append((part, sampled, sched.update(part, sampled, now)))
            except Exception as exc:  # this part's tokens cannot be applied
                failed.append((part, "update", exc))
    ended: list[Request] = []
    for part, part_phase, exc in failed:
        ended += sched.end_with_error(part_requests(part), now, failure_detail(part_phase, exc))
    # parts that failed in execute come before those whose update failed: batch order again
    position = {id(req): i for i, req in enumerate(part_requests(out))}
    ended.sort(key=lambda req: position[id(req)])
    # every part ran when retried (a transient fault): nothing ended, still reported
    _, first_phase, first_error = failed[0] if failed else (out, phase, error)
    num_succeeded = sum(part.num_seqs for part, _, _ in applied)
    c = Contained(StepFailure(out.step_id, first_phase, first_error,
                              tuple(r.request_id for r in ended), num_succeeded), ended=ended)
    for _, sampled, (rows, finished) in applied:
        c.rows += rows
        c.finished += finished
        c.sampled += sampled
    return c
