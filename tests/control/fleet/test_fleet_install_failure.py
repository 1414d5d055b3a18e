"""A healthy replica that fails to install a change (not one that is down) is not counted
as converged: the change's answer and GET /control/config say so, and that replica keeps
its old fleet version in the ingress's view until it really installs one."""

from __future__ import annotations

from fixtures.fleet_fakes import FakeReplica
from test_fleet_control_plane import run_fleet


class FailingReplica(FakeReplica):
    """Replica 2 answers every real install with a failure (dry runs pass)."""

    async def install(self, config: dict, version: int, **kw) -> dict:
        if kw["dry_run"] or self.replica_id != 2:
            return await super().install(config, version, **kw)
        return {"ok": False, "status": 500, "code": "install_failed", "message": "disk full"}


def test_a_replica_that_failed_to_install_is_not_converged():
    async def scenario(c, fakes, fleet):
        await fleet.stop_polls()  # no poll may correct what the change recorded
        changed = await c.patch("/control/config", headers={"If-Match": "0"},
                                json={"changes": {"max_num_seqs": 16}})
        assert changed.status_code == 200 and not changed.json()["converged"], changed.text
        got = (await c.get("/control/config")).json()
        assert not got["converged"] and got["replicas"][2]["fleet_version"] == 0, got
        assert fakes[2].fleet_version == 0 and fakes[0].fleet_version == 1

    run_fleet(scenario, replica=FailingReplica)
