"""One step's budget: the tokens and sequences the scheduler may still give out.

Made from the step's `LiveConfig` snapshot (`max_num_batched_tokens`, `max_num_seqs`);
every limit the scheduler applies, to the running set and to new prefills, under either
schedule policy, is read from here. A scheduled request takes one sequence and at least
one token, so `room` (the smaller of the two) is the most requests the step can still
serve: the running set is served in turn when it holds more than that.

`StepPlan` keeps the step's work (`SchedulerOutput`) and its budget in step: work is added
and taken back through it, and `output()` holds the result to the limits. With a step law,
it also keeps the step's predicted time (`StepTime`, engine/scheduling/step_time.py) in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.calibration.step_law import StepLaw
from engine.config import LiveConfig
from engine.errors import SchedulerInvariantError
from engine.records import PrefillChunk, SchedulerOutput, SchedulingDecisions
from engine.request import Request
from engine.scheduling.goodput import StepTarget
from engine.scheduling.step_time import LawSlowdown, StepTime


@dataclass(slots=True)
class StepBudget:
    """What one step may still schedule, out of its config's limits."""

    max_tokens: int  # max_num_batched_tokens of the step's config
    max_seqs: int  # max_num_seqs of the step's config
    tokens_left: int
    seqs_left: int

    @property
    def room(self) -> int:
        """The most requests this step can still serve (each takes a sequence, >= 1 token)."""
        return min(self.tokens_left, self.seqs_left)

    def take(self, num_tokens: int, num_seqs: int = 1) -> None:
        self.tokens_left -= num_tokens
        self.seqs_left -= num_seqs

    def give_back(self, num_tokens: int, num_seqs: int = 1) -> None:
        """Return what an unscheduled request (a preemption victim) had taken."""
        self.tokens_left += num_tokens
        self.seqs_left += num_seqs

    def check(self, step_id: int, num_tokens: int, num_seqs: int) -> None:
        """Raise unless the step's work fits its limits and matches what was taken."""
        if (num_tokens > self.max_tokens or num_seqs > self.max_seqs
                or self.tokens_left != self.max_tokens - num_tokens
                or self.seqs_left != self.max_seqs - num_seqs):
            raise SchedulerInvariantError(
                f"step {step_id} scheduled {num_tokens} tokens and {num_seqs} sequences;"
                f" limits max_num_batched_tokens={self.max_tokens},"
                f" max_num_seqs={self.max_seqs}; budget left {self.tokens_left} tokens,"
                f" {self.seqs_left} sequences")


@dataclass(slots=True)
class StepPlan:
    """The step being scheduled: its config snapshot, its work so far, what is left of its
    budget, and what its scheduling decided besides the work."""

    live: LiveConfig
    out: SchedulerOutput
    budget: StepBudget
    decisions: SchedulingDecisions
    chunk_tokens: int  # the most prompt tokens one request runs this step
    time: StepTime | None = None  # None: no step law (budgets the operator's), no time limit

    @classmethod
    def new(cls, step_id: int, live: LiveConfig, law: StepLaw | None = None,
            target: StepTarget | None = None, slowdown: LawSlowdown | None = None, *,
            tokens: int | None = None, chunk: int | None = None) -> StepPlan:
        """`law` and `target` (engine/scheduling/goodput.py): the step's time is held to the
        target, scaled by `slowdown`, only while chunked prefill is on (off, a chunk must be
        a whole prompt). `tokens`, `chunk`: the step's token budget and chunk size
        (default: the config's; a grown step's are larger)."""
        tokens = live.max_num_batched_tokens if tokens is None else tokens
        seqs = live.max_num_seqs
        timed = law is not None and target is not None and live.chunked_prefill
        out = SchedulerOutput(step_id, [], [], live.version, tokens)
        time = None
        if timed:
            aim_s = (slowdown or LawSlowdown()).step_target_s(target.seconds)
            time = StepTime.start(law, aim_s)
            out.target_s, out.step_reason = target.seconds, target.reason
        return cls(live, out, StepBudget(tokens, seqs, tokens, seqs),
                   SchedulingDecisions([], [], {}, {}, {}),
                   live.prefill_chunk_size if chunk is None else chunk, time)

    def take_decodes(self, num_decodes: int, context: int) -> None:
        """Charge decodes already in out.decodes (`context`: the KV tokens they attend)."""
        self.budget.take(num_decodes, num_decodes)
        if self.time is not None:
            self.time.take_decodes(num_decodes, context)

    def chunk_room(self, req: Request) -> int:
        """The most tokens req's next chunk may run by the step's time (no limit without a
        law); a step's first chunk always gets some (engine/scheduling/step_time.py)."""
        if self.time is None:
            return self.budget.max_tokens
        return self.time.chunk_room(req.num_computed_tokens, not self.out.prefills)

    def add_chunk(self, req: Request, num_tokens: int) -> None:
        """Run `num_tokens` of req's prompt (from num_computed_tokens on) this step."""
        sample = req.num_computed_tokens + num_tokens == req.num_tokens
        self.out.prefills.append(PrefillChunk(req, num_tokens, sample))
        self.budget.take(num_tokens)
        if self.time is not None:
            self.time.take_chunk(req.num_computed_tokens, num_tokens)

    def unschedule(self, victim: Request) -> None:
        """Take back the work a preemption victim was given earlier in this step."""
        out, budget = self.out, self.budget
        decode_context = None
        if victim in out.decodes:
            out.decodes.remove(victim)
            budget.give_back(1)
            decode_context = victim.num_computed_tokens + 1
        chunks = [c for c in out.prefills if c.request is victim]
        for chunk in chunks:
            budget.give_back(chunk.num_tokens)
        out.prefills = [c for c in out.prefills if c.request is not victim]
        if self.time is not None:
            self.time.give_back(decode_context, [(victim.num_computed_tokens, c.num_tokens)
                                                 for c in chunks])

    def output(self) -> SchedulerOutput:
        """Count the work's tokens and hold it to the limits; the step's output."""
        out, budget = self.out, self.budget
        num_decodes = out.num_decode_tokens = len(out.decodes)
        num_prefill = out.num_prefill_tokens = sum(c.num_tokens for c in out.prefills)
        budget.check(out.step_id, num_decodes + num_prefill, num_decodes + len(out.prefills))
        if self.time is not None:
            out.predicted_s, out.law_features = self.time.predicted_s, self.time.features
        return out
