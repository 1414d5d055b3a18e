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
executor writes the same KV slots again. A failed part's requests are then ended with
ERROR by the engine (blocks freed, out of the running set and their lanes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request

DEFAULT_MAX_EXTRA_RUNS = 16  # executor calls a failed step may add to find its culprits
STEP_FAILED = "step failed"  # the start of a failed request's finish detail (its reason)


@dataclass(frozen=True)
class StepFailure:
    """What failed in one step, and whom it ended."""

    step_id: int
    phase: str  # where the first failing part failed: execute | update
    error: Exception  # that part's exception
    request_ids: tuple[str, ...]  # ended with ERROR, in batch order (none: every part
    # ran when retried, a transient fault)
    num_succeeded: int  # requests of the step whose part ran and was applied

    @property
    def whole_step(self) -> bool:
        """Nothing in the step ran: what makes a run of failures a sick engine."""
        return self.num_succeeded == 0

    @property
    def detail(self) -> str:
        return failure_detail(self.phase, self.error)


def failure_detail(phase: str, error: Exception) -> str:
    """A failed request's finish detail: what failed, never the exception's text (it can
    carry internals); the server log has the traceback."""
    return f"{STEP_FAILED}: {phase} raised {type(error).__name__}"


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


def execute_isolating(execute: Callable[[SchedulerOutput], list[int]], out: SchedulerOutput,
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
    """A failed step's outcome: what the parts that ran produced, and the parts that
    failed (with the phase they failed in and why)."""

    rows: list[Request] = field(default_factory=list)  # as update() returns them
    finished: list[Request] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    failed: list[tuple[SchedulerOutput, str, Exception]] = field(default_factory=list)
    num_succeeded: int = 0  # requests whose part ran and was applied


Update = Callable[[SchedulerOutput, list[int], float], tuple[list[Request], list[Request]]]


def contain(execute: Callable[[SchedulerOutput], list[int]], update: Update,
            out: SchedulerOutput, phase: str, error: Exception, max_extra_runs: int,
            now: float) -> Contained:
    """`phase` ("execute" or "update") of the step `out` raised `error`. An execute
    failure is bisected and the parts that ran are applied (`update(part, sampled, now)`);
    an update failure may have applied part of the batch, so all of it fails."""
    c = Contained()
    if phase != "execute":
        c.failed.append((out, phase, error))
        return c
    done, failed = execute_isolating(execute, out, max_extra_runs, error)
    c.failed += [(part, "execute", exc) for part, exc in failed]
    for part, sampled in done:
        try:
            rows, finished = update(part, sampled, now)
        except Exception as exc:  # this part's tokens cannot be applied
            c.failed.append((part, "update", exc))
            continue
        c.rows += rows
        c.finished += finished
        c.sampled += sampled
        c.num_succeeded += part.num_seqs
    return c
