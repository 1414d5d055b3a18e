"""Edges of the fleet's control plane (control/fleet/control_plane.py) and of the ingress's
half of autoscaling (control/fleet/scaling.py), over stand-in replicas (no Ray): dry runs
and empty changes, a replica that is down or slow or refusing, the reconcile loop's pace,
slots autoscaling keeps off, and the signals, holds and events the scaling rules read."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from fixtures.fleet_fakes import FakeReplica, until
from test_fleet_control_plane import run_fleet
from test_fleet_scaling_local import ADMIN, APP, CONFIG, READ
from test_fleet_scaling_local import run_fleet as run_scaled_fleet

from control.fleet.autoscale import SlotState
from control.fleet.autoscale_board import MemoryBoard, publish_slot
from control.fleet.loads import LoadTable
from control.fleet.scaling import FleetScaling

CHANGE = {"changes": {"max_num_seqs": 16}}
V0 = {"If-Match": "0"}


async def reconcile_fast(fleet, every_s: float = 0.02) -> asyncio.Task:
    """A second reconcile loop, every `every_s` (the ingress's runs every 0.5 s): what it
    does many times a test sees in a fraction of a second."""
    return asyncio.ensure_future(fleet.control.reconcile_forever(every_s))


class CountingReplica(FakeReplica):
    """Counts every real install it is asked for (answered or not); `fail` refuses them
    (a disk full), `down_dies` makes any call while not ready raise (a dead process), and
    `install_s` is how long an install takes."""

    fail = down_dies = False
    install_s = 0.01

    def __init__(self, replica_id: int):
        super().__init__(replica_id)
        self.asked: list[int] = []

    async def install(self, config: dict, version: int, **kw) -> dict:
        if not kw["dry_run"]:
            self.asked.append(version)
        if self.down_dies and not self.ready:
            raise RuntimeError(f"replica {self.replica_id} is dead")
        if not kw["dry_run"] and self.fail:
            return {"ok": False, "status": 500, "code": "install_failed", "message": "disk full"}
        await asyncio.sleep(self.install_s)
        return await super().install(config, version, **kw)


# ---- control_plane.py ---------------------------------------------------------------------
def test_a_dry_run_or_a_change_of_nothing_records_no_version_and_pushes_nothing():
    async def scenario(c, fakes, fleet):
        dry = await c.patch("/control/config?dry_run=true", json=CHANGE, headers=V0)
        assert dry.status_code == 200, dry.text
        assert dry.json()["applied"] is False and dry.json()["diff"]["max_num_seqs"][1] == 16
        same = await c.patch("/control/config", json={"changes": {"max_num_seqs": 128}},
                             headers=V0)  # the value it has already
        assert same.status_code == 200 and same.json()["applied"] is False, same.text
        assert (await c.get("/control/config")).json()["version"] == 0
        assert [f.asked for f in fakes] == [[], [], []]
    run_fleet(scenario, replica=CountingReplica)


def test_a_change_while_a_replica_is_dead_skips_it_and_reaches_it_once_back():
    async def scenario(c, fakes, fleet):
        fakes[1].down_dies, fakes[1].ready = True, False
        await until(lambda: not fleet.table.views[1].healthy)
        fast = await reconcile_fast(fleet)
        ok = await c.patch("/control/config", json=CHANGE, headers=V0)
        assert ok.status_code == 200, ok.text  # neither checked on nor pushed to it
        assert ok.json()["replicas"][1]["code"] == "replica_down"
        await asyncio.sleep(0.3)  # many reconcile rounds: a down replica is not called
        assert fakes[1].asked == []
        fakes[1].ready = True
        await until(lambda: fakes[1].asked == [1])
        fast.cancel()
    run_fleet(scenario, replica=CountingReplica)


def test_a_slow_replica_converges_and_converge_s_is_the_slowest_install():
    async def scenario(c, fakes, fleet):
        fakes[2].install_s = 0.25  # mid-step: slow, not failed
        ok = (await c.patch("/control/config", json=CHANGE, headers=V0)).json()
        assert ok["converged"] and ok["converge_s"] >= 0.25, ok
    run_fleet(scenario, replica=CountingReplica)


def test_a_replica_that_refuses_a_push_is_retried_after_its_delay_and_shown_failed():
    async def scenario(c, fakes, fleet):
        fakes[2].fail = True
        fast = await reconcile_fast(fleet)
        changed = (await c.patch("/control/config", json=CHANGE, headers=V0)).json()
        assert not changed["converged"]
        await asyncio.sleep(0.4)  # 20 reconcile rounds, well within RETRY_S
        assert fakes[2].asked == [1]
        row = (await c.get("/control/config")).json()["replicas"][2]
        assert row["last_push"]["ok"] is False and row["last_push"]["error"] == "disk full"
        fast.cancel()
    run_fleet(scenario, replica=CountingReplica)


def test_a_replica_still_installing_is_not_pushed_again_meanwhile():
    async def scenario(c, fakes, fleet):
        await fleet.stop_polls()  # its view says version 0 until the push lands
        fakes[1].install_s = 0.3
        fast = await reconcile_fast(fleet)
        await c.patch("/control/config", json=CHANGE, headers=V0)
        fleet.table.views[1].polled["fleet_version"] = 0  # as a poll from before the push
        await asyncio.sleep(0.5)  # one reconcile push at most, never two at once
        assert fakes[1].asked in ([1], [1, 1]), fakes[1].asked
        fast.cancel()
    run_fleet(scenario, replica=CountingReplica)


def test_slots_autoscaling_keeps_off_get_no_push_and_no_audit_row():
    async def scenario(c, fakes, fleet, board):
        await asyncio.sleep(0.1)
        ok = await c.patch("/control/config", json=CHANGE, headers={**ADMIN, **V0})
        assert ok.status_code == 200 and ok.json()["converged"], ok.text
        await fleet.control.audit("test", "ops", {"x": [0, 1]}, "note")
        assert fakes[0].installs == [1] and fakes[1].installs == fakes[2].installs == []
        assert len(fakes[0].events) == 1 and fakes[1].events == fakes[2].events == []
        assert (await c.get("/control/config", headers=READ)).json()["converged"]
    run_scaled_fleet(scenario)


# ---- scaling.py ---------------------------------------------------------------------------
class FakeControl:
    def __init__(self):
        self.versions, self.canary, self.audited = None, None, []

    async def audit(self, source, actor, change, note):
        self.audited.append(source)


def scaling_over(n: int = 3, restart=None) -> FleetScaling:
    fleet = SimpleNamespace(handles=[None] * n, table=LoadTable(n), restart=restart,
                            control=FakeControl(), control_api=False)
    return FleetScaling(fleet, CONFIG, MemoryBoard(), APP)


def test_a_retiring_slot_is_a_scale_event_under_way():
    scaling = scaling_over()
    assert scaling.in_flight() is None
    scaling.phases[1], scaling.reasons[1] = "retiring", "idle"
    assert scaling.in_flight() == "replica 1 is retiring (idle)"


def test_a_down_replica_or_one_a_restart_took_out_is_not_load_the_rules_read():
    scaling = scaling_over()
    views = scaling.fleet.table.views
    for view in views:
        view.healthy, view.polled = True, {"waiting": 5, "running": 2}
    views[1].healthy = False  # its last poll is stale: it is down
    views[0].routable = False  # a rolling restart has it out
    slots = scaling.signals(time.time()).slots
    assert [s.waiting for s in slots] == [5, 0, 5]  # slot 1 is down: none of its queue
    assert slots[1].running == 0 and not slots[0].routed


def test_only_a_running_restart_or_canary_holds_the_autoscaler():
    restart = SimpleNamespace(running=True, restart_id="restart-1")
    scaling = scaling_over(restart=restart)
    assert scaling.hold() == "rolling restart restart-1"
    restart.running = False
    scaling.fleet.control.canary = SimpleNamespace(running=False, canary_id="canary-1")
    assert scaling.hold() is None  # both done
    scaling.fleet.control.canary.running = True
    assert scaling.hold() == "canary canary-1"


def test_scale_events_count_only_routed_replicas_and_audit_only_scale_up_and_down():
    async def go(scaling):
        await scaling.changed(1, "off", "starting", "waiting", 0.5)
        await scaling.changed(1, "starting", "on", "waiting")
        await asyncio.sleep(0)  # the audit tasks run
    scaling = scaling_over()
    asyncio.run(go(scaling))
    events = list(scaling.events)
    assert [(e["event"], e["routed_replicas"]) for e in events] == [("scale_up", 1),
                                                                   ("ready", 2)]
    assert scaling.fleet.control.audited == ["autoscale_scale_up"]


def test_a_phase_read_from_the_board_keeps_how_long_its_want_held():
    scaling = scaling_over()
    publish_slot(scaling.board, APP, 1, SlotState("starting", "waiting", None, 0.0, 0.25))
    asyncio.run(scaling.tick())
    (event,) = scaling.events
    assert (event["event"], event["replica_id"], event["waited_s"]) == ("scale_up", 1, 0.25)
