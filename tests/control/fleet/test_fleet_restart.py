"""A rolling restart (control/fleet/restart.py) on stand-in replicas (no engine, no Ray):
one replica at a time, out of routing while it drains, retired only once its requests in
flight ended (or the grace ran out: counted), back only as a new incarnation on the fleet's
config version; the 409s, the tokens, and `batchpilot fleet restart` itself."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from fixtures.fleet_fakes import FakeReplica, fake_fleet_server, until

from control.admin.auth import Token
from control.cli.ctl_error import CtlError
from control.cli.main import main
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.restart import RestartBody, start_restart
from control.fleet.restart_cli import ABORTED_EXIT, _body, add_restart_parser
from control.fleet.router import RoutingPolicy


class RestartableReplica(FakeReplica):
    """`retire` takes this "process" down; `come_back_s` later a new one answers (new
    incarnation and pid, on the YAML's fleet version 0). None: it never comes back."""

    def __init__(self, replica_id: int, log: list, come_back_s: float | None = 0.1):
        super().__init__(replica_id)
        self.log, self.come_back_s = log, come_back_s
        self.generation, self.pid, self.down = 1, 1000 + replica_id, False
        self.retires: list[float] = []  # the grace each retire got
        self.aborts = 0  # what retire answers: requests its own drain had to abort
        self.table = None  # the ingress's LoadTable, to see routing as retire happens
        self.routable_at_retire: list[list[bool]] = []
        self.install_s = 0.0  # how long a config push takes (on top of FakeReplica's)

    def stats(self, *_: object) -> dict:
        if self.down:
            raise RuntimeError("restarting")
        return {**super().stats(), "incarnation": f"{self.replica_id}.{self.generation}",
                "pid": self.pid}

    async def retire(self, grace_s: float) -> int:
        self.retires.append(grace_s)
        self.routable_at_retire.append([v.routable for v in self.table.views])
        self.log.append(("retire", self.replica_id))
        self.down = True
        if self.come_back_s is not None:
            asyncio.get_running_loop().call_later(self.come_back_s, self._new_process)
        return self.aborts

    async def install(self, config: dict, version: int, **kw) -> dict:
        await asyncio.sleep(self.install_s)
        return await super().install(config, version, **kw)

    def _new_process(self) -> None:
        self.generation, self.pid, self.fleet_version = self.generation + 1, self.pid + 100, 0
        self.down = False
        self.log.append(("back", self.replica_id))


def run_fleet(scenario, n: int = 3, tokens: tuple[Token, ...] = (), **fake_kw):
    async def go():
        log: list = []
        fakes = [RestartableReplica(i, log, **fake_kw) for i in range(n)]
        fleet = FleetIngress([LocalHandle(f) for f in fakes], RoutingPolicy(), poll_s=0.02,
                             seed=0, control_tokens=tokens)
        for fake in fakes:
            fake.table = fleet.table
        fleet.start_polls()
        await wait_healthy(lambda: all(v.healthy for v in fleet.table.views))
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as c:
                return await scenario(c, fakes, fleet, log)
        finally:
            await fleet.stop_polls()
    return asyncio.run(go())


def test_one_replica_at_a_time_out_of_routing_until_back_new_and_converged():
    async def scenario(c, fakes, fleet, log):
        changed = await c.patch("/control/config", headers={"If-Match": "0"},
                                json={"changes": {"max_num_seqs": 8}})
        assert changed.json()["version"] == 1  # a restarted replica comes back on 0
        fleet.table.started(0)
        fleet.table.started(0)  # two requests in flight on replica 0
        run = await start_restart(fleet, RestartBody(grace_s=10, ready_timeout_s=10), "ops")
        await until(lambda: run.steps[0]["phase"] == "draining")
        routed = {fleet.route({"prompt": f"prompt {k}"}, {}).replica_id for k in range(60)}
        assert routed == {1, 2}  # the draining replica gets nothing new
        await asyncio.sleep(0.3)
        assert fakes[0].retires == []  # it waits for the two requests
        fleet.table.done(0)
        fleet.table.done(0)
        await asyncio.wait_for(run.task, 15)
        assert run.status == "done" and run.aborted == 0, run.to_dict()
        assert fakes[0].retires[0] > 9  # drained early: the grace left went to the replica
        assert log == [(kind, i) for i in range(3) for kind in ("retire", "back")]
        for fake in fakes:  # only the replica being restarted was out of routing
            assert fake.routable_at_retire == [[j != fake.replica_id for j in range(3)]]
        for step in run.steps:
            assert step["old"]["incarnation"] != step["new"]["incarnation"]
            assert step["drain_s"] >= 0 and step["restart_s"] > 0.05 and step["ready_s"] >= 0
        assert [f.fleet_version for f in fakes] == [1, 1, 1]  # reconciled before routing
        assert [f.installs[-1] for f in fakes] == [1, 1, 1] and \
            all(len(f.installs) == 2 for f in fakes)
        assert [e["phase"] for e in run.events if e["replica_id"] == 1] == [
            "draining", "restarting", "converging", "done"]
        assert all(v.routable for v in fleet.table.views)
        got = (await c.get("/control/fleet/restart")).json()["restart"]
        assert got["status"] == "done" and got["restart_id"] == "restart-1"
        kinds = [e["kind"] for e in (await c.get("/control/history")).json()["events"]]
        assert kinds == ["restart_start", "restart_end"]
    run_fleet(scenario)


def test_requests_left_after_the_grace_are_aborted_by_the_replica_and_counted():
    async def scenario(c, fakes, fleet, log):
        fakes[0].aborts = 1
        fleet.table.started(0)  # never ends
        run = await start_restart(fleet, RestartBody(grace_s=0.3, replicas=[0]), "ops")
        await asyncio.wait_for(run.task, 10)
        assert run.status == "done" and run.aborted == 1 and run.steps[0]["aborted"] == 1
        assert fakes[0].retires == [0.0]  # the grace was spent waiting: abort at once
        assert run.steps[0]["drain_s"] >= 0.3 and fakes[1].retires == []
        assert "1 aborted" in run.events[1]["message"]
    run_fleet(scenario, n=2)


def test_a_replica_that_does_not_come_back_stops_the_restart():
    async def scenario(c, fakes, fleet, log):
        run = await start_restart(fleet, RestartBody(grace_s=1, ready_timeout_s=0.5), "ops")
        await asyncio.wait_for(run.task, 10)
        assert run.status == "failed"
        assert "replica 0 to come back as a new process" in run.error
        assert fakes[1].retires == []  # the next one was left alone
        assert fleet.table.views[0].routable  # routed to again once Serve brings it up
    run_fleet(scenario, n=2, come_back_s=None)


def test_a_restarted_replica_is_routed_to_only_once_it_runs_the_fleets_config():
    """It comes back on the YAML (version 0): routed to before the push of the fleet's
    version lands, it would serve on a config the fleet has moved away from."""
    async def scenario(c, fakes, fleet, log):
        changed = await c.patch("/control/config", headers={"If-Match": "0"},
                                json={"changes": {"max_num_seqs": 8}})
        assert changed.json()["version"] == 1
        await until(lambda: [f.fleet_version for f in fakes] == [1, 1])
        fakes[0].install_s = 0.3  # the push to the new process takes a while
        run = await start_restart(fleet, RestartBody(grace_s=1, replicas=[0]), "ops")
        seen = set()  # (routable, fleet version) of replica 0 through the restart
        while not run.task.done():
            seen.add((fleet.table.views[0].routable, fakes[0].fleet_version))
            await asyncio.sleep(0.005)
        assert run.status == "done", run.to_dict()
        # invariant: never routable while it runs the YAML's version 0
        assert (False, 0) in seen and (True, 0) not in seen, seen
        assert fleet.table.views[0].routable and fakes[0].fleet_version == 1
    run_fleet(scenario, n=2)


def test_one_at_a_time_and_not_with_a_canary_and_admin_only():
    admin, reader = Token("ops", "admin", "s3cret"), Token("viewer", "read", "r3ad")
    as_admin = {"Authorization": "Bearer s3cret"}

    async def scenario(c, fakes, fleet, log):
        url = "/control/fleet/restart"
        assert (await c.post(url, json={})).status_code == 401
        read_only = await c.post(url, headers={"Authorization": "Bearer r3ad"}, json={})
        assert read_only.status_code == 403
        assert (await c.get(url, headers={"Authorization": "Bearer r3ad"})).json() == \
            {"restart": None}
        bad = await c.post(url, headers=as_admin, json={"grace_s": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "grace_s"
        for ids in ([0, 5], [0, 0]):  # out of range; one replica twice
            bad = await c.post(url, headers=as_admin, json={"replicas": ids})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "replicas"
        for odd, param in (({"grace": 1}, "grace"), ({"replicas": [True]}, "replicas"),
                           ({"reason": "x" * 5000}, "reason")):  # never a guessed restart
            bad = await c.post(url, headers=as_admin, json=odd)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
        canary = await c.post("/control/canary", headers={**as_admin, "If-Match": "0"},
                              json={"changes": {"max_num_seqs": 8}, "watch_s": 60})
        assert canary.status_code == 202, canary.text
        refused = await c.post(url, headers=as_admin, json={})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == \
            "canary_running" and "canary-1" in refused.json()["error"]["message"]
        fleet.control.canary.task.cancel()
        fleet.control.canary.status = "rolled_back"
        started = await c.post(url, headers=as_admin, json={"grace_s": 1, "reason": "upgrade"})
        assert started.status_code == 202 and started.json()["restart"]["actor"] == "ops"
        again = await c.post(url, headers=as_admin, json={})
        assert again.status_code == 409 and again.json()["error"]["code"] == \
            "restart_running" and "restart-1" in again.json()["error"]["message"]
        canary = await c.post("/control/canary", headers={**as_admin, "If-Match": "0"},
                              json={"changes": {"max_num_seqs": 4}, "watch_s": 60})
        assert canary.status_code == 409 and canary.json()["error"]["code"] == \
            "restart_running"
        await asyncio.wait_for(fleet.restart.task, 15)
        assert fleet.restart.status == "done"
    run_fleet(scenario, n=2, tokens=(admin, reader), come_back_s=0.5)


def test_a_single_replica_fleet_cannot_roll():
    async def scenario(c, fakes, fleet, log):
        answer = await c.post("/control/fleet/restart", json={})
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "single_replica"
    run_fleet(scenario, n=1)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_cli_prints_each_phase_and_exits_by_the_outcome(capsys):
    log: list = []
    fakes = [RestartableReplica(i, log) for i in range(2)]
    port = _port()
    url = f"http://127.0.0.1:{port}"
    with fake_fleet_server(fakes, port) as fleet:
        for fake in fakes:
            fake.table = fleet.table
        assert main(["fleet", "restart", "--url", url, "--grace", "5"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "restart-1: replicas [0, 1] one at a time, grace 5 s"
        assert [line.split(": ")[1] for line in out[1:-1]] == \
            ["draining", "restarting", "converging", "done"] * 2
        assert out[1].split("]")[1].startswith(" replica 0: draining")
        assert out[-1].startswith("restart-1 done: 2 replica(s) restarted in")
        assert out[-1].endswith("0 request(s) aborted")

        fakes[1].aborts = 1
        assert main(["fleet", "restart", "--url", url, "--grace", "0.2", "--replicas",
                     "1"]) == ABORTED_EXIT
        assert capsys.readouterr().out.splitlines()[-1].endswith("1 request(s) aborted")

        fakes[0].come_back_s = None
        assert main(["fleet", "restart", "--url", url, "--timeout", "0.5"]) == 1
        assert "FAILED" in capsys.readouterr().out
        assert main(["fleet", "restart", "--url", url, "--follow"]) == 1  # the last one
        assert "restart-3 FAILED" in capsys.readouterr().out
    assert main(["fleet", "restart", "--url", url, "--replicas", "a"]) == 2


def test_no_replica_is_retired_while_no_other_one_is_routable():
    async def scenario(c, fakes, fleet, log):
        fleet.table.exclude(1)  # the only other replica is out of routing
        run = await start_restart(fleet, RestartBody(grace_s=1, ready_timeout_s=0.3,
                                                     replicas=[0]), "ops")
        await asyncio.wait_for(run.task, 10)
        assert run.status == "failed", run.to_dict()
        assert "another replica to serve while replica 0 restarts" in run.error
        assert fakes[0].retires == [] and log == []
    run_fleet(scenario, n=2)


def test_the_cli_sends_its_grace_timeout_and_replicas_as_given():
    """--timeout is how long a replica may take to come back, --grace its requests' time."""
    import argparse

    parser = argparse.ArgumentParser()
    add_restart_parser(parser.add_subparsers())
    args = parser.parse_args(["restart", "--grace", "5", "--timeout", "60", "--replicas",
                              "2,0", "--reason", "kernel update"])
    assert _body(args) == {"grace_s": 5.0, "ready_timeout_s": 60.0, "replicas": [2, 0],
                           "reason": "kernel update"}
    bad = parser.parse_args(["restart", "--replicas", "0,x"])
    with pytest.raises(CtlError) as refused:
        _body(bad)
    assert refused.value.code == 2
