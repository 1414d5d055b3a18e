"""The ingress's /control over stand-in replicas (no Ray, no engine): fleet versions, the
single server's errors, convergence and reconciliation, and canaries that promote, roll
back, or run out of requests. Each fake replica answers what EngineReplica would."""

from __future__ import annotations

import asyncio

import httpx
from fixtures.fleet_fakes import FakeReplica, good_window, until

from control.admin.auth import Token
from control.admin.config_store import ChangeError
from control.fleet.canary_run import poll_every
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.router import RoutingPolicy
from control.fleet.versioning import HISTORY_LIMIT, FleetVersions, install_on
from engine.config import LiveConfig, StaticConfig
from engine.config.patch import apply_patch, live_to_dict


def run_fleet(scenario, n: int = 3, tokens: tuple[Token, ...] = (),
              replica: type[FakeReplica] = FakeReplica, control_api: bool = True):
    async def main():
        fakes = [replica(i) for i in range(n)]
        fleet = FleetIngress([LocalHandle(f) for f in fakes], RoutingPolicy(), poll_s=0.02,
                             control_tokens=tokens, control_api=control_api)
        fleet.start_polls()
        await wait_healthy(lambda: all(v.healthy for v in fleet.table.views))
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as c:
                return await scenario(c, fakes, fleet)
        finally:
            await fleet.stop_polls()
    return asyncio.run(main())


async def converged_config(c, timeout_s: float = 10.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (config := (await c.get("/control/config")).json())["converged"]:
        assert asyncio.get_running_loop().time() < deadline, config
        await asyncio.sleep(0.02)
    return config


def test_a_change_is_versioned_pushed_to_every_replica_and_converges():
    async def scenario(c, fakes, fleet):
        assert (await c.get("/control/config")).json()["converged"] is True
        body = {"changes": {"max_num_seqs": 16}, "reason": "incident 7"}
        no_match = await c.patch("/control/config", json=body)
        assert no_match.status_code == 428
        stale = await c.patch("/control/config", json=body, headers={"If-Match": "5"})
        assert stale.status_code == 412 and stale.json()["current_version"] == 0
        bad = await c.patch("/control/config", json={"changes": {"max_num_seqs": 0}},
                            headers={"If-Match": "0"})
        try:  # the very words one server answers with
            apply_patch(LiveConfig(), StaticConfig(), {"max_num_seqs": 0})
        except ValueError as exc:
            assert bad.status_code == 400 and bad.json()["error"]["message"] == str(exc)
        ok = await c.patch("/control/config", json=body, headers={"If-Match": "0"})
        assert ok.status_code == 200 and ok.headers["etag"] == '"1"'
        data = ok.json()
        assert data["applied"] and data["version"] == 1 and data["converged"]
        assert data["diff"]["max_num_seqs"][1] == 16 and data["converge_s"] > 0
        assert [f.installs for f in fakes] == [[1], [1], [1]]
        fakes[2].fleet_version = 0  # Serve restarted it: it runs the YAML again
        await until(lambda: fleet.table.views[2].polled["fleet_version"] == 0)
        got = (await c.get("/control/config")).json()
        assert got["converged"] is False and got["replicas"][2]["target_version"] == 1
        await until(lambda: fakes[2].installs == [1, 1])  # the reconcile loop pushed it
        await until(lambda: fleet.table.views[2].polled["fleet_version"] == 1)
        assert (await c.get("/control/config")).json()["converged"] is True
        back = await c.post("/control/rollback/0", json={"reason": "undo"})
        assert back.json()["version"] == 2 and back.json()["config"] == \
            live_to_dict(LiveConfig())
        history = (await c.get("/control/history")).json()["versions"]
        assert [(v["version"], v["source"], v["actor"]) for v in history] == [
            (0, "startup", "fleet"), (1, "api", "local"), (2, "rollback:0", "local")]
        assert history[1]["reason"] == "incident 7"
        profile = await c.post("/control/profiles/degrade", json={})
        assert profile.json()["config"]["max_num_seqs"] == 8
        named = await c.patch("/control/config", json=body, headers={
            "If-Match": "3", "X-Batchpilot-Replica": "1"})
        assert named.status_code == 409 and named.json()["error"]["code"] == "fleet_managed"
    run_fleet(scenario)


def test_a_replica_that_is_down_gets_the_change_when_it_is_back():
    async def scenario(c, fakes, fleet):
        fakes[1].ready = False  # not ready (draining, restarting): not routed, not pushed
        await until(lambda: not fleet.table.views[1].healthy)
        ok = await c.patch("/control/config", headers={"If-Match": "0"},
                           json={"changes": {"max_num_seqs": 32}})
        data = ok.json()
        assert ok.status_code == 200 and data["version"] == 1 and not data["converged"]
        assert data["replicas"][1]["code"] == "replica_down" and fakes[1].installs == []
        got = (await c.get("/control/config")).json()
        assert not got["converged"] and not got["replicas"][1]["healthy"]
        fakes[1].ready = True
        await until(lambda: fakes[1].installs == [1])  # the reconcile loop
        await until(lambda: fleet.table.views[1].polled.get("fleet_version") == 1)
        assert (await c.get("/control/config")).json()["converged"]
    run_fleet(scenario)


def test_the_fleet_control_api_checks_tokens_as_one_server_does():
    tokens = (Token("alice", "admin", "secret-admin"), Token("graf", "read", "secret-read"))

    async def scenario(c, fakes, fleet):
        assert (await c.get("/control/config")).status_code == 401
        read = {"Authorization": "Bearer secret-read"}
        assert (await c.get("/control/config", headers=read)).status_code == 200
        denied = await c.patch("/control/config", json={"changes": {"max_num_seqs": 9}},
                               headers={**read, "If-Match": "0"})
        assert denied.status_code == 403
        done = await c.patch("/control/config", json={"changes": {"max_num_seqs": 9}},
                             headers={"Authorization": "Bearer secret-admin",
                                      "If-Match": "0"})
        assert done.status_code == 200
        history = (await c.get("/control/history", headers=read)).json()["versions"]
        assert history[-1]["actor"] == "alice"
        # the canary's state and the autoscaler's settings are behind the same tokens
        assert (await c.get("/control/canary")).status_code == 401
        assert (await c.get("/control/canary", headers=read)).status_code == 200
        scale = await c.patch("/control/fleet/autoscale", headers=read,
                              json={"changes": {"up_waiting": 2}})
        assert scale.status_code == 403, scale.text  # a read token changes no rule
    run_fleet(scenario, tokens=tokens)


def test_a_fleet_without_its_control_api_has_no_control_route():
    """--no-control-api: every /control route, the canary's state among them, is a 404."""
    async def scenario(c, fakes, fleet):
        for path in ("/control/config", "/control/canary", "/control/history",
                     "/control/fleet/autoscale"):
            off = await c.get(path)
            assert off.status_code == 404, (path, off.text)
            assert off.json()["error"]["code"] == "control_off", path
    run_fleet(scenario, control_api=False)


def test_a_route_relayed_to_a_named_replica_checks_the_callers_scope_first():
    # replicas started without the fleet's tokens (tokens only in the ingress's environment)
    # would not check them again: a read token drained any replica this way
    tokens = (Token("alice", "admin", "secret-admin"), Token("graf", "read", "secret-read"))
    read = {"Authorization": "Bearer secret-read"}

    async def scenario(c, fakes, fleet):
        for path in ("/control/drain", "/control/resume"):
            denied = await c.post(path, json={}, headers={**read, "X-Batchpilot-Replica": "0"})
            assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
        for value in ("0" * 4999 + "1", "99999999"):  # int() of 5,000 digits raised: a 500
            odd = await c.get("/control/config", headers={**read, "X-Batchpilot-Replica": value})
            assert odd.status_code == 400, odd.text
            assert odd.json()["error"]["param"] == "X-Batchpilot-Replica"
            assert len(odd.text) < 500  # the value is not echoed whole
        request = c.build_request("GET", "/control/config", headers=read)
        request.headers = type(request.headers)([*request.headers.raw,
                                                 (b"X-Batchpilot-Replica", b"0"),
                                                 (b"X-Batchpilot-Replica", b"1")])
        twice = await c.send(request)
        assert twice.status_code == 400, twice.text
        admin = {"Authorization": "Bearer secret-admin"}
        for path in ("/control/drain/", "/control/no-such-route", "/v1/trace/summary/"):
            # no replica is asked: its redirect named its internal address
            lost = await c.post(path, json={}, headers=admin)
            assert lost.status_code == 404 and "location" not in lost.headers, lost.text
        denied = await c.patch("/control/config", json={"changes": 5},
                               headers={**read, "If-Match": "0"})  # scope before the body
        assert denied.status_code == 403, denied.text
    run_fleet(scenario, tokens=tokens)


async def start_canary(c, watch_s: float = 0.4, **extra) -> httpx.Response:
    return await c.post("/control/canary", headers={"If-Match": "0"}, json={
        "changes": {"max_num_seqs": 1}, "replicas": 1, "watch_s": watch_s,
        "reason": "try it", **extra})


async def wait_decided(c) -> dict:
    for _ in range(500):
        run = (await c.get("/control/canary")).json()["canary"]
        if run["status"] != "watching":
            return run
        await asyncio.sleep(0.02)
    raise AssertionError("the canary never decided")


def test_a_bad_canary_rolls_back_with_its_evidence_and_blocks_changes_meanwhile():
    async def scenario(c, fakes, fleet):
        fakes[0].windows[1] = good_window(20, ttft=0.8)  # the canary's candidate: slow
        for f in fakes[1:]:
            f.windows[0] = good_window(20, ttft=0.05)
        started = await start_canary(c, watch_s=2.0)
        assert started.status_code == 202, started.text
        assert started.json()["canaries"] == [0] and started.json()["baseline"] == [1, 2]
        assert fakes[0].fleet_version == 1 and fakes[1].fleet_version == 0
        blocked = await c.patch("/control/config", json={"changes": {"max_num_seqs": 4}},
                                headers={"If-Match": "0"})
        assert blocked.status_code == 409 and "canary-1" in blocked.json()["error"]["message"]
        run = await wait_decided(c)
        assert run["status"] == "rolled_back"
        decision = run["decision"]
        assert decision["canary"]["ttft_p99_s"] > 0.7 and decision["baseline"]["requests"] == 40
        assert decision["thresholds"]["ttft_rel"] == 0.25 and "ttft_p99_s" in decision["why"]
        await until(lambda: fakes[0].fleet_version == 0)  # the canary went back
        # NOTE: the replica installs version 0 before the control plane records its answer:
        # the fleet reads converged a moment after, not at once
        config = await converged_config(c)
        assert config["version"] == 0
        events = (await c.get("/control/history")).json()["events"]
        assert [e["kind"] for e in events] == ["canary_start", "canary_rollback"]
        await until(lambda: all("canary_rollback" in [s for s, _ in f.events] for f in fakes))
    run_fleet(scenario)


def test_a_good_canary_is_promoted_to_every_replica():
    async def scenario(c, fakes, fleet):
        fakes[0].windows[1] = good_window(20, ttft=0.05)
        for f in fakes[1:]:
            f.windows[0] = good_window(20, ttft=0.05)
        assert (await start_canary(c)).status_code == 202
        run = await wait_decided(c)
        assert run["status"] == "promoted" and run["decision"]["converged"]
        assert [f.fleet_version for f in fakes] == [1, 1, 1]
        assert (await c.get("/control/config")).json()["version"] == 1
    run_fleet(scenario)


def test_a_canary_with_too_few_requests_extends_then_rolls_back():
    async def scenario(c, fakes, fleet):
        fakes[0].windows[1] = good_window(2, ttft=0.05)
        for f in fakes[1:]:
            f.windows[0] = good_window(20, ttft=0.05)
        assert (await start_canary(c, watch_s=0.3)).status_code == 202
        run = await wait_decided(c)
        assert run["status"] == "rolled_back" and run["extensions"] == 1
        assert run["decision"]["why"].startswith("inconclusive")
        bad = await start_canary(c, replicas=3)  # no baseline left
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "replicas"
        for odd in ({"replicas": True}, {"replicas": 1e9}, {"poll_s": 1e-9},
                    {"replica": 1}):  # a guess, a flood of polls, a misspelt field
            refused = await start_canary(c, **odd)
            assert refused.status_code == 400, (odd, refused.text)
            assert refused.json()["error"]["param"] == next(iter(odd)), refused.text
    run_fleet(scenario)


def test_a_canary_takes_its_own_min_requests_and_a_poll_period_from_its_window():
    """min_requests in the body is the rule the canary runs (and shows); without poll_s the
    window is compared about ten times, 1 to 15 s apart."""
    async def scenario(c, fakes, fleet):
        fakes[0].windows[1] = good_window(2, ttft=0.05)  # 2 requests: enough for this rule
        for f in fakes[1:]:
            f.windows[0] = good_window(2, ttft=0.05)
        started = await start_canary(c, watch_s=0.3, min_requests=2)
        assert started.status_code == 202, started.text
        assert started.json()["thresholds"]["min_requests"] == 2
        assert started.json()["poll_s"] == 1.0  # 0.3 s / 10, at least 1 s
        run = await wait_decided(c)
        assert run["status"] == "promoted" and run["extensions"] == 0, run["decision"]
    run_fleet(scenario)
    assert [poll_every(w) for w in (5.0, 60.0, 3600.0)] == [1.0, 6.0, 15.0]


def test_a_canary_is_refused_on_a_named_replica_or_without_a_healthy_baseline():
    """A canary is the fleet's: X-Batchpilot-Replica gets 409 fleet_managed; and with only
    the canaries themselves healthy (every baseline replica down) there is nothing to
    compare them with: 503, nothing pinned or pushed."""
    async def scenario(c, fakes, fleet):
        named = await c.post("/control/canary", headers={"If-Match": "0",
                                                         "X-Batchpilot-Replica": "0"},
                             json={"changes": {"max_num_seqs": 1}, "replicas": 1})
        assert named.status_code == 409 and named.json()["error"]["code"] == "fleet_managed"
        for f in fakes[1:]:
            f.ready = False
        await until(lambda: [v.healthy for v in fleet.table.views] == [True, False, False])
        alone = await start_canary(c)
        assert alone.status_code == 503, alone.text
        assert alone.json()["error"]["code"] == "no_replica"
        assert (await c.get("/control/canary")).json()["canary"] is None
        assert [f.installs for f in fakes] == [[], [], []]
    run_fleet(scenario)


class DrainableReplica(FakeReplica):
    """Answers a relayed HTTP call as EngineReplica.http does; replica 1's call fails."""

    async def http(self, method, path, query, headers, body):
        if self.replica_id == 1:
            raise RuntimeError("replica 1 died")
        yield {"accepted": self.replica_id}
        yield {"status": 200, "headers": [["content-type", "application/json"]]}
        yield {"body": b'{"admission": "draining"}'}

    async def drain(self, grace_s: float) -> int:
        return 0


def test_a_drain_one_replica_missed_is_mixed_and_a_draining_fleet_says_so():
    """POST /control/drain answers "draining" only when every replica took it (else 502,
    "mixed", each replica's answer); a fleet that drains (shutting down) shows it in
    /control/config and /readyz, and refuses new requests with a 503 and Retry-After."""
    async def scenario(c, fakes, fleet):
        drained = await c.post("/control/drain", json={})
        assert drained.status_code == 502, drained.text
        assert drained.json()["admission"] == "mixed"
        assert [r["status"] for r in drained.json()["replicas"]] == [200, 0, 200]
        assert (await c.get("/control/config")).json()["admission"] == "open"
        await fleet.drain(0.1)
        assert (await c.get("/control/config")).json()["admission"] == "draining"
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        refused = await c.post("/v1/completions", json={"prompt": "hi"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "draining"
    run_fleet(scenario, replica=DrainableReplica)


class SlowInstall(FakeReplica):
    """A replica whose installs wait for `release` (a push under way)."""

    def __init__(self, replica_id: int):
        super().__init__(replica_id)
        self.release = asyncio.Event()
        self.release.set()

    async def install(self, config: dict, version: int, **kw) -> dict:
        await self.release.wait()
        return await super().install(config, version, **kw)


def test_a_replica_back_on_the_yaml_takes_no_request_until_it_runs_the_fleets_config():
    """Serve restarted it (or autoscaling started it): it comes up on the YAML, version 0,
    while the fleet is at 1. Routed meanwhile, its requests would run under the old config
    (another tenant's lanes, the limits before an incident's change); none go to it until the
    reconcile loop's push lands. With no replica on the fleet's version, all are routed."""
    def routed_to(fleet) -> set[int]:
        return {fleet.route({"prompt": f"document {k}"}, {}).replica_id for k in range(60)}

    async def scenario(c, fakes, fleet):
        ok = await c.patch("/control/config", headers={"If-Match": "0"},
                           json={"changes": {"max_num_seqs": 32}})
        assert ok.json()["converged"]
        for _ in range(10):  # no poll sent before the push undoes it (one once did)
            assert [v.polled.get("fleet_version") for v in fleet.table.views] == [1, 1, 1]
            await asyncio.sleep(0.01)
        assert routed_to(fleet) == {0, 1, 2}
        fakes[1].release.clear()  # its next push waits
        fakes[1].fleet_version = 0  # restarted: back on the YAML
        await until(lambda: [v.polled.get("fleet_version") for v in fleet.table.views]
                    == [1, 0, 1])
        assert routed_to(fleet) == {0, 2}
        fakes[1].release.set()
        await until(lambda: fakes[1].installs == [1, 1])  # the reconcile loop's push
        await until(lambda: fleet.table.views[1].polled.get("fleet_version") == 1)
        assert routed_to(fleet) == {0, 1, 2}
        for fake in fakes:  # no replica on the fleet's version: availability first
            fake.fleet_version = 0
            fake.release.clear()
        await until(lambda: all(v.polled.get("fleet_version") == 0
                                for v in fleet.table.views))
        assert routed_to(fleet) == {0, 1, 2}
        for fake in fakes:
            fake.release.set()

    run_fleet(scenario, replica=SlowInstall)


class RefusingReplica(FakeReplica):
    """Answers a push as EngineReplica does (control/fleet/versioning.install_on) for a store
    whose engine refuses the value, naming the setting (ChangeError.invalid)."""

    class Store:
        async def install_fleet(self, config, fleet_version, **kw):
            raise ChangeError.invalid(ValueError("config.max_num_seqs=5 is above what this"
                                                 " replica's KV cache holds"))

    async def install(self, config: dict, version: int, **kw) -> dict:
        return await install_on(self.Store(), config, version, kw)


def test_a_replicas_refusal_reaches_the_caller_with_its_param():
    """A replica's refusal in the fleet's answer is one server's error: status, code,
    message naming the replica, and the `param` a client reads instead of the message."""
    async def scenario(c, fakes, fleet):
        refused = await c.patch("/control/config", headers={"If-Match": "0"},
                                json={"changes": {"max_num_seqs": 5}})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_value" and error["param"] == "max_num_seqs"
        assert error["message"].startswith("replica 0: config.max_num_seqs=5 is above")
        assert (await c.get("/control/config")).json()["fleet_version"] == 0  # nothing taken

    run_fleet(scenario, replica=RefusingReplica)


def test_a_replica_that_is_down_is_not_converged_whatever_it_last_reported():
    versions = FleetVersions({"max_num_seqs": 4}, clock=lambda: 0.0)
    versions.record({"max_num_seqs": 8}, {"max_num_seqs": [4, 8]}, actor="ops", source="api",
                    reason="")
    assert versions.convergence([1, 1], [True, True])["converged"]
    # its last poll said version 1, then it died: the change is not everywhere any more
    assert not versions.convergence([1, 1], [True, False])["converged"]
    # a slot autoscaling keeps off runs nothing: shown, not waited for
    assert versions.convergence([1, None], [True, False], [True, False])["converged"]


def test_the_history_keeps_version_0_past_its_limit():
    """Version 0 (the YAML every replica starts from) stays rollback-able however many
    changes follow; the oldest changes after it go."""
    versions = FleetVersions({"max_num_seqs": 4}, clock=lambda: 0.0)
    for n in range(HISTORY_LIMIT + 5):
        versions.record({"max_num_seqs": n}, {}, actor="ops", source="api", reason="")
    assert versions.get(0).config == {"max_num_seqs": 4}
    assert len(versions.history) == HISTORY_LIMIT + 1
    assert versions.history[1].version == 6 and versions.latest.version == HISTORY_LIMIT + 5
