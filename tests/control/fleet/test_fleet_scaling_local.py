"""The ingress's half of autoscaling (control/fleet/scaling.py) against stand-in replicas
and a stand-in for Serve's autoscaler that runs our policy (autoscale_board.policy_tick)
on an in-memory board, as the Serve controller does on Ray's: a burst starts slot 1, the
ingress routes to it once it is on, an idle spell drains it (nothing new, the request in
flight ends there) before it goes to 0; a slot with no replica is never called; the 409s of
a canary and a restart while a slot starts; the autoscale routes (read, change, refusals);
/metrics and /readyz."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
from fixtures.fleet_fakes import FakeReplica, until

from control.admin.auth import Token
from control.cli.ctl_format import fleet_text
from control.fleet.autoscale import AutoscaleConfig
from control.fleet.autoscale_board import MemoryBoard, policy_tick, read_signals
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.loads import LoadTable
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.router import RoutingPolicy
from control.fleet.scaling import FleetScaling

APP = "test-fleet"
CONFIG = AutoscaleConfig(1, 3, upscale_delay_s=0.2, downscale_delay_s=0.4)
TOKENS = (Token("ops", "admin", "admin-token"), Token("viewer", "read", "read-token"))
ADMIN = {"Authorization": "Bearer admin-token"}
READ = {"Authorization": "Bearer read-token"}


class ScalableReplica(FakeReplica):
    """A stand-in whose slot may have no replica (Serve's target 0): any call then is a
    test failure (on Serve it would start one). While its replica starts (target 1, not yet
    running) a call waits, as on Serve: here it fails like a poll that timed out."""

    def __init__(self, replica_id: int, running: bool):
        super().__init__(replica_id)
        self.running, self.target, self.waiting, self.stray_calls = running, int(running), 0, 0

    def stats(self, *_: object) -> dict:
        if not self.running:
            self.stray_calls += self.target == 0
            raise RuntimeError("no replica in this slot yet")
        return {**super().stats(), "waiting": self.waiting}


class FakeServe:
    """Serve's autoscaler, as far as our slots see it: every tick, each autoscaled slot's
    policy decides its replicas; a start takes `start_s` before the replica answers."""

    def __init__(self, board: MemoryBoard, fakes: list[ScalableReplica], start_s: float = 0.3):
        self.board, self.fakes, self.start_s = board, fakes, start_s
        self.targets = [1 if f.running else 0 for f in fakes]
        self.states: list[dict] = [{} for _ in fakes]
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for slot in range(CONFIG.min_replicas, len(self.fakes)):
                n, self.states[slot] = policy_tick(self.board, APP, slot, self.targets[slot],
                                                   self.states[slot], time.time())
                if n != self.targets[slot]:
                    self.targets[slot] = self.fakes[slot].target = n
                    if n:
                        loop.call_later(self.start_s, setattr, self.fakes[slot], "running",
                                        True)
                    else:
                        self.fakes[slot].running = False
            await asyncio.sleep(0.05)


def run_fleet(scenario):
    async def go():
        board = MemoryBoard()
        fakes = [ScalableReplica(i, running=i == 0) for i in range(3)]
        fleet = FleetIngress([LocalHandle(f) for f in fakes], RoutingPolicy(), poll_s=0.02,
                             seed=0, control_tokens=TOKENS, autoscale=CONFIG, board=board,
                             app=APP)
        serve = FakeServe(board, fakes)
        fleet.start_polls()
        serve.task = asyncio.ensure_future(serve.run())
        await wait_healthy(lambda: fleet.table.views[0].healthy)
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as c:
                return await scenario(c, fakes, fleet, board)
        finally:
            serve.task.cancel()
            await fleet.stop_polls()
    return asyncio.run(go())


def routed_to(fleet: FleetIngress, n: int = 40) -> set[int]:
    return {fleet.route({"prompt": f"prompt {k}"}, {}).replica_id for k in range(n)}


def test_a_burst_starts_a_replica_and_an_idle_spell_drains_then_stops_it():
    async def scenario(c, fakes, fleet, board):
        phases = fleet.scaling.phases
        await asyncio.sleep(0.3)
        assert phases == ["on", "off", "off"] and routed_to(fleet) == {0}
        assert fakes[1].stray_calls == fakes[2].stray_calls == 0  # never called
        # slots autoscaling keeps off run nothing: the fleet's config has converged (it
        # once read "converging" forever, slots 1 and 2 "down")
        got = (await c.get("/control/config", headers=READ)).json()
        assert got["converged"] and [r["live"] for r in got["replicas"]] == [True, False, False]
        assert "replicas 0:v0  1:off  2:off" in fleet_text(got)
        fakes[0].waiting = 3  # a queue builds on replica 0: 3 a replica, over 2
        await until(lambda: phases[1] == "starting")
        # a scale event under way: a canary or a restart would count a replica in flux
        canary = await c.post("/control/canary", headers={**ADMIN, "If-Match": "0"}, json={
            "changes": {"max_num_seqs": 8}, "replicas": 1, "watch_s": 5})
        restart = await c.post("/control/fleet/restart", headers=ADMIN, json={})
        assert canary.status_code == restart.status_code == 409, (canary.text, restart.text)
        assert canary.json()["error"]["code"] == restart.json()["error"]["code"] \
            == "scale_running"
        await until(lambda: phases[1] == "on")
        assert 1 in routed_to(fleet)  # (all of it: replica 0 has the queue)
        off = await c.post("/control/fleet/restart", headers=ADMIN, json={"replicas": [2]})
        assert off.status_code == 409 and off.json()["error"]["code"] == "scaled_in", off.text
        await asyncio.sleep(0.5)
        assert phases[2] == "off"  # one more, not two: 3 waiting over 2 is 1.5 a replica
        fakes[0].waiting = 0
        fleet.table.started(1)  # a request still running on replica 1
        await until(lambda: phases[1] == "retiring")
        assert routed_to(fleet) == {0}  # out of routing at once
        await asyncio.sleep(0.5)
        assert phases[1] == "retiring" and fakes[1].running  # it waits for the request
        fleet.table.done(1)
        await until(lambda: phases[1] == "off")
        assert not fakes[1].running
        stray = fakes[1].stray_calls
        await asyncio.sleep(0.3)
        assert fakes[1].stray_calls == stray == 0
        events = [(e["event"], e["replica_id"], e["reason"]) for e in fleet.scaling.events]
        assert events == [("scale_up", 1, "waiting"), ("ready", 1, "waiting"),
                          ("scale_down", 1, "idle"), ("stopped", 1, "idle")]
        await until(lambda: len(fakes[0].events) == 2)  # a row in the live replica's trace
        assert [source for source, _ in fakes[0].events] == ["autoscale_scale_up",
                                                             "autoscale_scale_down"]
        history = (await c.get("/control/history", headers=READ)).json()
        kinds = [e["kind"] for e in history["events"]]
        assert "autoscale_scale_up" in kinds and "autoscale_stopped" in kinds, kinds
        text = (await c.get("/metrics")).text
        assert 'batchpilot_fleet_replica_phase{phase="on",replica="0"} 1.0' in text
        assert 'batchpilot_fleet_replica_phase{phase="off",replica="1"} 1.0' in text
        assert ('batchpilot_fleet_scale_events_total{event="scale_up",reason="waiting",'
                'replica="1"} 1') in text
        ready = (await c.get("/readyz")).json()
        assert ready["autoscale"]["slots"][1]["phase"] == "off"
        named = await c.get("/v1/whatif", headers={**READ, "X-Batchpilot-Replica": "2"})
        assert named.status_code == 503 and named.json()["error"]["code"] == "scaled_in"
    run_fleet(scenario)


def test_a_retiring_replica_with_any_work_left_is_still_called():
    """A retiring slot is polled (and so kept from 0) while anything is left on it: a
    request in flight from here, one running, or one still queued there."""
    table = LoadTable(2)
    scaling = FleetScaling(SimpleNamespace(handles=[None, None], table=table), CONFIG,
                           MemoryBoard(), APP)
    scaling.phases[1] = "retiring"
    view = table.views[1]
    for polled, inflight, called in [({"running": 0, "waiting": 0}, 0, False),
                                     ({"running": 0, "waiting": 2}, 0, True),
                                     ({"running": 1, "waiting": 0}, 0, True),
                                     ({"running": 0, "waiting": 0}, 1, True)]:
        view.polled, view.inflight = polled, inflight
        assert scaling.callable(1) is called, (polled, inflight)
        assert scaling.live_ids() == ([0, 1] if called else [0])


def test_the_autoscale_settings_change_live_and_refuse_what_they_cannot_be():
    async def scenario(c, fakes, fleet, board):
        got = await c.get("/control/fleet/autoscale", headers=READ)
        assert got.status_code == 200 and got.json()["config"]["up_waiting"] == 2.0
        assert (await c.get("/control/fleet/autoscale")).status_code == 401
        denied = await c.patch("/control/fleet/autoscale", headers=READ,
                               json={"changes": {"up_waiting": 3}})
        assert denied.status_code == 403
        for body, needle in [
                ({"changes": {"up_waiting": -1}}, "up_waiting=-1.0 must be a number >= 0"),
                ({"changes": {"upscale_delay": 1}}, "unknown autoscale setting"),
                ({"changes": {"max_replicas": 4}}, "fixed when the fleet deploys"),
                ({"changes": {"up_waiting": 3}, "why": "typo"}, "why"),
                ({"changes": {"up_waiting": "x"}}, "changes"),
                ({"changes": {"up_waiting": "2"}}, "changes"),  # was read as 2
                ({"changes": {"up_kv_usage": True}}, "changes")]:  # was read as 1.0
            bad = await c.patch("/control/fleet/autoscale", headers=ADMIN, json=body)
            assert bad.status_code in (400, 422), (body, bad.text)
            assert needle in bad.text, (body, bad.text)
        ok = await c.patch("/control/fleet/autoscale", headers=ADMIN,
                           json={"changes": {"up_waiting": 3, "downscale_delay_s": 60},
                                 "reason": "slower to shrink"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["diff"] == {"up_waiting": [2.0, 3.0], "downscale_delay_s": [0.4, 60.0]}
        assert ok.json()["recorded"] is True  # in the fleet's history (below)
        await until(lambda: (s := read_signals(board, APP)) is not None
                    and s.config.up_waiting == 3.0)  # what Serve's policy reads next
        change = (await c.get("/control/fleet/autoscale", headers=READ)).json()
        assert change["config_changes"][-1]["actor"] == "ops"
        events = (await c.get("/control/history", headers=READ)).json()["events"]
        (audit,) = [e for e in events if e["kind"] == "autoscale_config"]
        assert audit["actor"] == "ops" and audit["reason"] == "slower to shrink"
        assert audit["diff"]["up_waiting"] == [2.0, 3.0]
    run_fleet(scenario)


def test_fleet_text_shows_each_replicas_version_target_health_and_off_slots():
    rows = [{"replica_id": 0, "fleet_version": 3, "target_version": 3, "healthy": True},
            {"replica_id": 1, "fleet_version": 2, "target_version": 3, "healthy": False},
            {"replica_id": 2, "fleet_version": None, "target_version": 3, "healthy": False,
             "live": False}]
    assert fleet_text({"converged": False, "replicas": rows}) == (
        "fleet converging   replicas 0:v3  1:v2->v3(down)  2:off")


def test_an_autoscale_change_no_replica_can_record_is_applied_and_says_so(caplog):
    """The fleet's history is built from a replica at first use: when none answers, the
    change is not refused (the autoscaler must still get it) and the miss is logged."""
    from control.fleet.scaling_routes import history_of

    class NoReplica:
        async def ready(self):
            raise RuntimeError("no replica answered")

    with caplog.at_level("WARNING", logger="batchpilot.fleet"):
        assert asyncio.run(history_of(NoReplica())) is None
    assert "not recorded in the fleet's history" in caplog.text
