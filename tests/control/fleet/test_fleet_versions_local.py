"""Fleet versions on real engines without Ray: two EngineReplicas of the tiny model in this
process (control/fleet/local.py). A change reaches both engines between steps, each step
record carries the fleet version into the replica's trace, and a trace file from before
the column existed still opens (and gains it)."""

from __future__ import annotations

import asyncio

import duckdb
import httpx

from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.replica import EngineReplica
from control.fleet.router import RoutingPolicy
from control.serve.settings import ServeSettings
from control.trace.schema import STEPS, Table, create_schema


def test_a_fleet_change_reaches_every_engine_and_stamps_its_steps(tiny_llama_dir, tmp_path):
    async def main():
        replicas = []
        for i in range(2):
            settings = ServeSettings(model=str(tiny_llama_dir), watch_config=False,
                                     trace_db=str(tmp_path / f"replica-{i}.duckdb"),
                                     engine_overrides={"num_kv_blocks": 64})
            replicas.append(await EngineReplica(settings, i).start())
        fleet = FleetIngress([LocalHandle(r) for r in replicas], RoutingPolicy(), poll_s=0.05)
        fleet.start_polls()
        await wait_healthy(lambda: all(v.healthy for v in fleet.table.views))
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://f") as c:
                before = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
                assert before.status_code == 200
                changed = await c.patch("/control/config", headers={"If-Match": "0"},
                                        json={"changes": {"max_num_seqs": 4}})
                assert changed.status_code == 200, changed.text
                assert changed.json()["version"] == 1 and changed.json()["converged"]
                for r in replicas:  # installed on each engine, with the version it names
                    assert r.state.engine.live_config.max_num_seqs == 4
                    assert r.state.config_store.fleet_version == 1
                    assert (await r.stats())["fleet_version"] == 1
                served = {}
                for tenant in ("t0", "t1", "t2", "t3", "t4", "t5"):
                    resp = await c.post("/v1/completions", headers={"X-Tenant": tenant},
                                        json={"prompt": f"b {tenant}", "max_tokens": 2})
                    served[int(resp.headers["x-batchpilot-replica"])] = True
                got = (await c.get("/control/config")).json()
                assert got["converged"] and [r["fleet_version"] for r in got["replicas"]] \
                    == [1, 1]
                assert replicas[0].audit_event("canary_rollback", "tester",
                                               {"fleet_version": [1, 1]}, '{"why": "slow"}')
                for i in served:  # the replica's window counts them under version 1
                    window = replicas[i].window(0.0, 1)
                    assert window["outcomes"].get("finished", 0) >= 1
                    assert replicas[i].window(0.0, 7)["outcomes"] == {}
        finally:
            await fleet.stop_polls()
            for r in replicas:
                await r.shutdown()
        return served

    served = asyncio.run(main())
    with duckdb.connect(str(tmp_path / "replica-0.duckdb"), read_only=True) as con:
        event = con.execute("SELECT actor, note FROM config_changes"
                            " WHERE source = 'canary_rollback'").fetchall()
    assert event == [("tester", '{"why": "slow"}')]  # the canary's evidence, in the trace
    for i in served:
        with duckdb.connect(str(tmp_path / f"replica-{i}.duckdb"), read_only=True) as con:
            versions = {v for (v,) in con.execute("SELECT DISTINCT fleet_version FROM steps")
                        .fetchall()}
            sources = [s for (s,) in con.execute("SELECT source FROM config_changes")
                       .fetchall()]
        assert 1 in versions and versions <= {0, 1}
        assert "fleet:1" in sources


def test_a_trace_from_before_fleet_version_opens_and_gains_the_column(tmp_path):
    path = str(tmp_path / "old.duckdb")
    added = [name for name, _ in STEPS.columns].index("fleet_version")  # schema 2 from here
    assert [name for name, _ in STEPS.columns[added:]] == [
        "fleet_version", "predicted_step_s", "target_step_s", "step_reason"]
    old_steps = Table("steps", STEPS.columns[:added], STEPS.time_column)  # schema 1
    with duckdb.connect(path) as con:
        con.execute(old_steps.ddl())
        con.execute("INSERT INTO steps (run_id, step_id, config_version) VALUES ('r', 1, 3)")
    with duckdb.connect(path) as con:
        create_schema(con)  # what the writer does when it opens the file
        rows = con.execute("SELECT step_id, config_version, fleet_version, predicted_step_s,"
                           " step_reason FROM steps").fetchall()
        names = [d[0] for d in con.execute("SELECT * FROM steps").description]
    assert rows == [(1, 3, None, None, None)]
    assert names == STEPS.column_names  # same positions: the writer inserts by position
