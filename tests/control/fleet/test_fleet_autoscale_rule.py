"""The autoscaling rule as tables, without Ray (control/fleet/autoscale.py): when the fleet
wants one replica more or fewer, and each slot's phases through a burst and an idle spell,
the drain included (a slot goes to 0 only once nothing is in flight on it)."""

from __future__ import annotations

import pytest

from control.fleet.autoscale import (
    RETIRE_SETTLE_S,
    AutoscaleConfig,
    FleetSignals,
    SlotSignal,
    SlotState,
    slot_step,
    wanted,
)

CFG = AutoscaleConfig(1, 3, upscale_delay_s=5.0, downscale_delay_s=30.0)


def signals(*slots: SlotSignal, at: float = 0.0, cfg: AutoscaleConfig = CFG,
            hold: str | None = None) -> FleetSignals:
    return FleetSignals(at, slots, cfg, hold)


def on(slot: int, **load) -> SlotSignal:
    return SlotSignal(slot, routed=True, ready=True, **load)


def off(slot: int) -> SlotSignal:
    return SlotSignal(slot, routed=False, ready=False)


@pytest.mark.parametrize("slots, want", [
    ((on(0, waiting=2, running=2), off(1)), (2, "waiting")),
    # enough to bring the queue under 2 a replica, at once: 5 waiting -> 3 (the max)
    ((on(0, waiting=5, running=2), off(1), off(2)), (3, "waiting")),
    ((on(0, waiting=4, running=2), off(1), off(2)), (3, "waiting")),  # 4/2 is not under 2
    ((on(0, waiting=3, running=2), off(1), off(2)), (2, "waiting")),
    # 8 waiting would want 5: never more than max_replicas (what the Fleet page shows)
    ((on(0, waiting=8, running=2), off(1), off(2)), (3, "waiting")),
    ((on(0, waiting=1, running=2), off(1)), (1, "steady")),  # 1 waiting < 2 a replica
    ((on(0, running=2, queue_slo_share=0.6), off(1)), (2, "queue_delay")),
    # the longest wait counts, not the mean: one replica's queue near its lane's TTFT
    # target is not averaged away by an idle one
    ((on(0, running=2, queue_slo_share=0.6), on(1, running=2), off(2)), (3, "queue_delay")),
    ((on(0, running=2, kv_usage=0.9), off(1)), (2, "kv_usage")),
    # two routed: 3 waiting is 1.5 a replica, under 2
    ((on(0, waiting=2, running=2), on(1, waiting=1, running=2)), (2, "steady")),
    ((on(0, running=1), on(1, running=0)), (1, "idle")),  # 1 running fits one replica
    ((on(0, running=1), on(1, running=1)), (2, "steady")),  # 2 running do not, at 1 each
    ((on(0, inflight=3), on(1)), (2, "steady")),  # the ingress's in-flight count counts
    ((on(0, running=0, kv_usage=0.8), on(1)), (2, "steady")),  # KV still warm: no idle
    ((on(0), off(1)), (1, "steady")),  # min_replicas: never fewer
    ((on(0, waiting=9), on(1, waiting=9), on(2, waiting=9)), (3, "steady")),  # at max
    ((off(0), off(1)), (1, "no_signal")),  # nothing routed: hold at the floor
])
def test_the_fleet_wants_one_more_on_pressure_and_one_fewer_when_idle(slots, want):
    assert wanted(signals(*slots)) == want


def run(slot: int, replicas: int, state: SlotState | None, sig: FleetSignals, now: float):
    return slot_step(slot, replicas, state, sig, now)


def test_a_slot_starts_only_after_the_pressure_held_for_the_delay():
    busy = signals(on(0, waiting=4), off(1), off(2), at=0.0)
    n, state = run(1, 0, None, busy, 0.0)
    assert n == 0 and state.phase == "off" and state.since == 0.0
    n, state = run(1, 0, state, signals(on(0, waiting=4), off(1), off(2), at=4.0), 4.0)
    assert n == 0 and state.phase == "off"
    n, state = run(1, 0, state, signals(on(0, waiting=4), off(1), off(2), at=5.0), 5.0)
    assert n == 1 and state.phase == "starting" and state.reason == "waiting"
    assert state.waited_s == 5.0  # what the scale event reports: the want held the delay
    # the slot after it does not start: the fleet wants one more, not two
    assert run(2, 0, None, busy, 100.0)[0] == 0


def test_pressure_that_lapses_restarts_the_delay():
    _, state = run(1, 0, None, signals(on(0, waiting=4), off(1), at=0.0), 0.0)
    _, state = run(1, 0, state, signals(on(0), off(1), at=3.0), 3.0)
    assert state.since is None
    n, state = run(1, 0, state, signals(on(0, waiting=4), off(1), at=6.0), 6.0)
    assert n == 0 and state.since == 6.0


def test_a_starting_slot_turns_on_when_it_polls_ready_and_keeps_running_meanwhile():
    state = SlotState("starting", "waiting", None, 10.0)
    quiet = signals(on(0), SlotSignal(1, routed=False, ready=False), at=20.0)
    n, state = run(1, 1, state, quiet, 20.0)
    assert n == 1 and state.phase == "starting"  # not ready: stays, even with no pressure
    ready = signals(on(0), SlotSignal(1, routed=False, ready=True), at=21.0)
    n, state = run(1, 1, state, ready, 21.0)
    assert n == 1 and state.phase == "on"


def test_an_idle_slot_drains_before_it_goes_to_zero():
    state = SlotState("on", "waiting", None, 0.0)
    idle = dict(at=100.0)
    n, state = run(1, 1, state, signals(on(0), on(1), **idle), 100.0)
    assert n == 1 and state.phase == "on" and state.since == 100.0
    n, state = run(1, 1, state, signals(on(0), on(1), at=130.0), 130.0)
    assert n == 1 and state.phase == "retiring" and state.reason == "idle"
    # the ingress has not yet seen `retiring`: signals from before then prove nothing
    n, state = run(1, 1, state, signals(on(0), off(1), at=130.5), 130.5)
    assert n == 1 and state.phase == "retiring"
    settled = 130.0 + RETIRE_SETTLE_S
    busy_tail = SlotSignal(1, routed=False, ready=True, inflight=1, running=1)
    n, state = run(1, 1, state, signals(on(0), busy_tail, at=settled), settled)
    assert n == 1 and state.phase == "retiring"  # a request still runs there
    drained = SlotSignal(1, routed=False, ready=True)
    n, state = run(1, 1, state, signals(on(0), drained, at=settled + 1), settled + 1)
    assert n == 0 and state.phase == "off" and state.reason == "idle"


@pytest.mark.parametrize("tail", [dict(inflight=1), dict(running=1), dict(waiting=1)],
                         ids=["ingress-inflight", "running", "waiting"])
def test_any_one_sign_of_work_holds_the_drain(tail):
    """The ingress's own in-flight count, the replica's running or its waiting: each alone
    keeps a retiring slot up (a request forwarded but not yet admitted is in none other)."""
    state = SlotState("retiring", "idle", None, 0.0)
    at = RETIRE_SETTLE_S + 1
    n, state = run(1, 1, state, signals(on(0), SlotSignal(1, routed=False, ready=True,
                                                          **tail), at=at), at)
    assert n == 1 and state.phase == "retiring"


def test_a_retiring_slot_is_kept_when_pressure_returns():
    state = SlotState("retiring", "idle", None, 0.0)
    busy = signals(on(0, waiting=5, running=2), SlotSignal(1, False, True), at=1.0)
    n, state = run(1, 1, state, busy, 1.0)
    assert n == 1 and state.phase == "on"


def test_a_hold_freezes_every_phase_but_a_drain():
    held = dict(hold="canary canary-1")
    n, state = run(1, 0, SlotState("off"), signals(on(0, waiting=9), off(1), at=5, **held), 5)
    assert n == 0 and state.phase == "off"
    n, state = run(1, 1, SlotState("on", since=0.0), signals(on(0), on(1), at=50, **held), 50)
    assert n == 1 and state.phase == "on"
    drained = SlotSignal(1, routed=False, ready=True)
    n, state = run(1, 1, SlotState("retiring", "idle", None, 0.0),
                   signals(on(0), drained, at=10, **held), 10)
    assert n == 0 and state.phase == "off"


def test_stale_or_missing_signals_hold_what_runs():
    assert run(1, 1, SlotState("on", since=0.0), None, 1000.0)[0] == 1
    old = signals(on(0), on(1), at=0.0)
    assert run(1, 1, SlotState("on", since=0.0), old, 1000.0) == (1, SlotState("on",
                                                                                since=0.0))
    assert run(1, 0, SlotState("off"), signals(on(0, waiting=9), off(1), at=0.0), 500)[0] == 0


def test_a_slot_that_never_becomes_ready_goes_back_to_off():
    state = SlotState("starting", "waiting", None, 0.0)
    n, state = run(1, 1, state, signals(on(0, waiting=9), off(1), at=2000.0), 2000.0)
    assert n == 0 and state.phase == "off" and state.reason == "start_timeout"


def test_slots_below_the_minimum_always_run_one():
    assert run(0, 1, None, signals(on(0), at=0.0), 0.0)[0] == 1


@pytest.mark.parametrize("changes, message", [
    ({"up_waiting": -1}, "up_waiting=-1.0 must be a number >= 0"),
    ({"up_kv_usage": 1.5}, "up_kv_usage=1.5 must be in 0..1"),
    ({"down_kv_usage": 0.9}, "must be below up_kv_usage"),
    ({"down_kv_usage": 0.85}, "down_kv_usage=0.85 must be below up_kv_usage=0.85"),  # no gap
    ({"min_replicas": 4}, "min_replicas=4 and max_replicas=3 must satisfy 1 <= min <= max"),
    ({"up_waiting": float("inf")}, "up_waiting=inf must be a number >= 0"),  # never scales
    ({"downscale_delay_s": float("nan")}, "downscale_delay_s=nan must be a number >= 0"),
    ({"upscale_delay": 3}, "unknown autoscale setting(s) ['upscale_delay']"),
    ({"up_waiting": "2"}, "must be a number"),
    ({"up_waiting": True}, "must be a number"),
    ({"min_replicas": 1.5}, "must be an integer"),
])
def test_a_bad_setting_is_an_error_that_names_it(changes, message):
    with pytest.raises(ValueError) as err:
        CFG.replace(changes)
    assert message in str(err.value)


def test_up_waiting_zero_scales_on_any_queue_and_never_on_none():
    """0 is a threshold (scale as soon as anything waits, or any wait counts against the
    lane's TTFT), not 'always': an idle fleet set so stays as it is."""
    eager = AutoscaleConfig(1, 3, up_waiting=0.0, up_queue_share=0.0)
    assert wanted(signals(on(0, running=2), off(1), cfg=eager)) == (1, "steady")
    assert wanted(signals(on(0, running=2, waiting=1), off(1), cfg=eager)) == (2, "waiting")


def test_an_idle_slot_drains_after_the_downscale_delay_not_the_upscale_one():
    """Idle 20 s is past upscale_delay_s (5) but not downscale_delay_s (30): the slot stays
    on; a fleet that shrank after every 5 s lull would start again at the next burst."""
    state = SlotState("on", "waiting", None, 0.0)
    for t in (100.0, 120.0):
        n, state = run(1, 1, state, signals(on(0), on(1), at=t), t)
        assert n == 1 and state.phase == "on" and state.since == 100.0, t
    n, state = run(1, 1, state, signals(on(0), on(1), at=130.0), 130.0)
    assert n == 1 and state.phase == "retiring"


def test_load_between_idle_spells_restarts_the_downscale_delay():
    """The delay is idleness held without a break: 25 s idle, a busy tick, 14 s idle is not
    39 s of idleness (the slot is still wanted between two bursts)."""
    def idle(t: float) -> FleetSignals:
        return signals(on(0), on(1), at=t)

    busy = signals(on(0, running=2), on(1, running=2), at=125.0)  # 4 do not fit one at 1
    n, state = run(1, 1, SlotState("on", "waiting", None, 0.0), idle(100.0), 100.0)
    n, state = run(1, 1, state, busy, 125.0)
    assert n == 1 and state.since is None  # wanted again: the idle spell is over
    for t in (126.0, 140.0):
        n, state = run(1, 1, state, idle(t), t)
    assert n == 1 and state.phase == "on" and state.since == 126.0
    n, state = run(1, 1, state, idle(156.0), 156.0)  # idle 30 s without a break: it drains
    assert n == 1 and state.phase == "retiring"


def test_a_hold_keeps_a_retiring_slot_draining_even_when_pressure_returns():
    """A canary or rolling restart counts on the replicas routed when it began: no slot
    changes phase under it, so a retiring slot is not taken back into routing (it goes on
    draining; test_a_retiring_slot_is_kept_when_pressure_returns is the case without)."""
    state = SlotState("retiring", "idle", None, 0.0)
    tail = SlotSignal(1, routed=False, ready=True, running=1)
    busy = signals(on(0, waiting=5, running=2), tail, at=1.0, hold="canary canary-1")
    n, state = run(1, 1, state, busy, 1.0)
    assert n == 1 and state.phase == "retiring"


def test_signals_round_trip_as_json():
    sig = signals(on(0, waiting=3, kv_usage=0.5), off(1), at=12.5, hold="x")
    assert FleetSignals.from_dict(sig.to_dict()) == sig
    assert SlotState.from_dict({"phase": "nonsense"}) is None


def test_a_burst_starts_every_slot_it_needs_at_once():
    """8 waiting on the one routed replica want 3 (the max here): slots 1 and 2 both start
    once the delay has held, not one delay and start after the other."""
    burst = [signals(on(0, waiting=8), off(1), off(2), at=t) for t in (0.0, 5.0)]
    for slot in (1, 2):
        n, state = run(slot, 0, None, burst[0], 0.0)
        n, state = run(slot, 0, state, burst[1], 5.0)
        assert n == 1 and state.phase == "starting" and state.reason == "waiting", slot


def test_the_policy_reads_fresh_signals_after_the_clock_steps_back():
    """Serve's policy caches the board's signals READ_CACHE_S; a cache stamped in the future
    (the wall clock stepped back, NTP) is stale, not fresh for as long as the step."""
    from control.fleet.autoscale_board import MemoryBoard, policy_tick, publish_signals

    class CountingBoard(MemoryBoard):
        reads = 0

        def get(self, key: str) -> bytes | None:
            self.reads += key.endswith("/signals")
            return super().get(key)

    board, app = CountingBoard(), "clock-step-fleet"
    publish_signals(board, app, signals(on(0), at=1000.0))
    policy_tick(board, app, 1, 0, {}, 1000.0)
    policy_tick(board, app, 1, 0, {}, 1000.1)  # within the cache: not read again
    assert board.reads == 1
    policy_tick(board, app, 1, 0, {}, 400.0)  # the clock went back 10 minutes
    assert board.reads == 2
