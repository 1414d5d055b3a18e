"""A CPU engine's step threads (engine/calibration/thread_governor.py): on a quiet machine
they stay as they are and no trial runs; when another process holds a core (steps on all
threads several times their start, one thread far cheaper) the steps go to one thread, and
back once all threads are cheaper again; a trial that loses is undone and the next waits
longer. Then on the simulated engine: the switch reaches the gauges and the step record."""

from __future__ import annotations

import dataclasses

from engine.calibration.budget_fit import fit_step_budgets
from engine.calibration.thread_governor import (
    BACKOFF_S,
    KEEP,
    SUSPECT,
    TRIAL,
    WINDOW,
    ThreadGovernor,
)
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.step_cost import CostProber, CpuLikeStepCost
from tests.engine.test_step_cost_drift import steady_trace


class Machine:
    """Relative step costs by thread count: `costs[threads]`, changed by the test."""

    def __init__(self, costs: dict[int, float]):
        self.costs, self.threads, self.calls = costs, 2, []

    def set_threads(self, threads: int) -> None:
        self.threads = threads
        self.calls.append(threads)

    def run(self, governor: ThreadGovernor, steps: int, t: float, dt: float = 0.1) -> float:
        """`steps` steps `dt` apart from `t`; the time after them."""
        for _ in range(steps):
            t += dt
            governor.observe(self.costs[self.threads], t)
        return t


def test_a_quiet_machine_runs_only_the_probes_and_undoes_them():
    machine = Machine({2: 1.0, 1: 1.6})
    governor = ThreadGovernor(2, machine.set_threads)
    t = machine.run(governor, 2000, 0.0)  # 200 s
    machine.costs[2] = SUSPECT  # at the line, not over it
    machine.run(governor, 1200, t)  # 120 s more: past PROBE_EVERY_S
    assert machine.calls == [1, 2] * 2  # at the start and PROBE_EVERY_S later
    assert governor.threads == 2 and governor.switches == 0


def test_a_server_that_started_beside_the_other_process_finds_one_thread_by_its_probe():
    """Its first steps were already slow, so they are its start: relative costs near 1,
    never suspect. The probe after its first WINDOW steps tries one thread anyway."""
    machine = Machine({2: 1.0, 1: 0.3})
    governor = ThreadGovernor(2, machine.set_threads)
    machine.run(governor, WINDOW + TRIAL, 0.0)
    assert (governor.threads, machine.threads, governor.switches) == (1, 1, 1)


def test_another_process_on_the_cores_sends_the_steps_to_one_thread_and_back():
    machine = Machine({2: 1.0, 1: 1.6})
    governor = ThreadGovernor(2, machine.set_threads)
    t = machine.run(governor, WINDOW, 0.0)
    machine.costs = {2: 9.0, 1: 2.0}  # the measured case: 18-21 s against 2.0-2.4 s
    t = machine.run(governor, WINDOW + TRIAL, t)
    assert (governor.threads, machine.threads, governor.switches) == (1, 1, 1)
    switched = len(machine.calls)  # the start's probe (undone), then the switch
    t = machine.run(governor, 2000, t)  # 200 s: trials of 2 threads lose while it runs
    assert governor.threads == 1 and machine.threads == 1
    tries = machine.calls[switched:]
    assert tries == [2, 1] * 3  # at 30, +30 and +60 s: each failed trial doubles the wait
    machine.costs = {2: 1.0, 1: 1.6}  # the hog is gone
    t = machine.run(governor, 10 * 300, t)  # longer than the back-off reached (120 s)
    assert (governor.threads, machine.threads, governor.switches) == (2, 2, 2)
    calls = len(machine.calls)
    machine.run(governor, 1000, t)
    assert len(machine.calls) <= calls + 2  # quiet again: at most a probe, undone
    assert governor.threads == machine.threads == 2


def test_a_trial_that_does_not_win_by_the_margin_is_undone_and_the_next_waits():
    machine = Machine({2: 2.0, 1: 2.0 * KEEP + 0.01})  # suspect, but one thread barely better
    governor = ThreadGovernor(2, machine.set_threads)
    t = machine.run(governor, WINDOW + TRIAL, 0.0)  # the start's probe: no back-off
    t = machine.run(governor, TRIAL + 1, t)  # suspect at once
    assert machine.calls == [1, 2, 1, 2] and governor.threads == 2
    machine.run(governor, int(BACKOFF_S / 0.1) - TRIAL - 2, t)
    assert machine.calls == [1, 2, 1, 2]  # no trial before the back-off has passed
    machine.run(governor, 3, t + BACKOFF_S)
    assert machine.calls == [1, 2, 1, 2, 1]


def test_steps_without_a_relative_cost_do_not_count():
    machine = Machine({2: 9.0, 1: 1.0})
    governor = ThreadGovernor(2, machine.set_threads)
    for i in range(500):
        governor.observe(None, i * 0.1)
    assert machine.calls == [] and governor.threads == 2


@dataclasses.dataclass
class Contended:
    """CpuLikeStepCost on the simulated engine, 8x as costly on all threads and 1.5x on
    one once the clock passes `at` (another process on the cores)."""

    clock: FakeClock
    at: float
    machine: Machine
    cost: CpuLikeStepCost = dataclasses.field(default_factory=CpuLikeStepCost)

    def __call__(self, out) -> float:
        if self.clock.now < self.at:
            return self.cost(out) * (1.0 if self.machine.threads == 2 else 1.6)
        return self.cost(out) * (8.0 if self.machine.threads == 2 else 1.5)


def test_the_engine_moves_its_steps_to_one_thread_and_says_so():
    config, fit = fit_step_budgets(EngineConfig(StaticConfig(num_kv_blocks=1024,
                                                             max_model_len=2048),
                                                LiveConfig()), set(),
                                   CostProber(CpuLikeStepCost()))
    clock, machine = FakeClock(), Machine({})
    executor = SimulatedExecutor(clock=clock, cost_model=Contended(clock, clock.now + 40,
                                                                   machine), shadow_kv=False)
    engine = Engine(config, executor, clock=clock, step_law=fit.law)
    engine.thread_governor = ThreadGovernor(2, machine.set_threads)
    start, switches = clock.now, []
    simulate(engine, clock, steady_trace(90.0),
             on_step=lambda out: switches.append((out.record.end_time - start,
                                                  out.record.thread_switch))
             if out.record is not None and out.record.thread_switch else None)
    [(at, switch)] = switches
    assert 40 < at < 50  # within seconds of the other process's start
    assert (switch.replaced, switch.threads) == (2, 1) and switch.before > 2 * switch.after
    assert "another process is on the cores" in switch.describe()
    reading = engine.gauges().step_cost
    assert (reading.threads, reading.thread_switches) == (1, 1)
