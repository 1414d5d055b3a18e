"""The replay's light path through the real Engine: the same admission, expiry, schedule,
update and finish (the Engine's and Scheduler's own methods), without the per-step
telemetry a replay never reads (StepRecord, StepOutput, wall-clock timings, deltas).

    engine = ReplayEngine(config, LeanExecutor(model, clock), clock=clock)
    step = engine.replay_step()   # -> ReplayStep (ran=False: no request was left)

A replay through `Engine.step` and one through `ReplayEngine.replay_step` give the same
records, steps, KV peak and preemptions (tests/control/whatif/test_whatif_speed.py holds
them equal on a trace with preemptions, cancels, timeouts and rejections).
Both run the step through `Engine.run_step`. NOTE: the modelled executor never raises, so
a failure the engine contained (a scheduler bug) is raised here instead of ending the
replayed batch with ERROR.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from control.whatif.calibrate import StepTimeModel
from engine.calibration.step_law import chunk_pairs
from engine.engine import Engine
from engine.records import RequestRecord, SchedulerOutput
from engine.sim.executor import FakeClock

_computed = attrgetter("num_computed_tokens")
SAMPLED_TOKEN = 7  # every replayed request ignores EOS, so any id will do


class LeanExecutor:
    """Advances the clock by the fitted time of each step (calibrate.FEATURES order: fixed,
    prefill tokens, decode tokens, decode context, sequences, prefill pairs, prompt step).
    Keeps the largest value of each feature and counts the steps beyond the fit's range
    (StepTimeModel.beyond_seen)."""

    def __init__(self, model: StepTimeModel, clock: FakeClock):
        self.coef = model.coef
        self.clock = clock
        self.limit = [1.05 * v for v in model.seen_max]  # beyond_seen's 5% slack
        self.largest = [1.0] + [0.0] * (len(model.coef) - 1)
        self.steps = 0
        self.beyond_seen = 0

    def execute(self, out: SchedulerOutput) -> list[int]:
        decodes = out.decodes
        # each decode attends to its computed tokens and the one it adds
        context = sum(map(_computed, decodes)) + len(decodes)
        pairs = sum(chunk_pairs(ch.request.num_computed_tokens, ch.num_tokens)
                    for ch in out.prefills)
        prefill = out.num_prefill_tokens
        row = (1.0, prefill, out.num_decode_tokens, context, out.num_seqs, pairs,
               1.0 if prefill else 0.0)
        big, limit = self.largest, self.limit
        beyond = False
        for i in range(1, len(row)):
            big[i] = max(big[i], row[i])
            beyond = beyond or row[i] > limit[i]
        self.beyond_seen += beyond
        self.steps += 1
        self.clock.now += sum(c * v for c, v in zip(self.coef, row, strict=True))
        return [SAMPLED_TOKEN] * (len(decodes) + sum(1 for ch in out.prefills if ch.sample))


@dataclass
class ReplayStep:
    ran: bool  # a step ran (False: no request was left, only the ended ones to report)
    tokens: int  # tokens the step ran (0: nothing could run, time must move on)
    preempted: int  # requests the step preempted
    kv_used: int  # KV blocks held after the step
    finished: list[RequestRecord]  # ended in or since the last step (aborts, timeouts)


class ReplayEngine(Engine):
    """An Engine whose replay_step skips the telemetry (see the module docstring)."""

    def replay_step(self) -> ReplayStep:
        start = self.clock()
        self._expire(start)
        # rejections, aborts and timeouts since the last step (most steps have none)
        ended = self._take_pending() if self._pending_admissions or self._pending_finished \
            else []
        if not self.requests:
            return ReplayStep(False, 0, 0, 0, ended)
        run = self.run_step(start)
        if run.failure is not None:
            raise RuntimeError(f"replayed step failed in {run.failure.phase}") \
                from run.failure.error
        # as Engine.step: the law's slowdown and online refit see the (modelled) step time
        self.scheduler.observe_step(run.out.predicted_s, run.out.law_features, run.end - start)
        ended.extend(RequestRecord.from_request(r) for r in run.finished)
        return ReplayStep(True, run.out.num_tokens, len(run.decisions.preempted),
                          self.block_manager.num_used, ended)

    def _take_pending(self) -> list[RequestRecord]:
        """Records of requests ended between steps; the deltas and admission decisions no
        replay reads are dropped (every ended request has a delta only if it finished)."""
        ended = [RequestRecord.from_request(r) for r in self._pending_finished]
        self._pending_finished, self._pending_deltas, self._pending_admissions = [], [], []
        return ended
