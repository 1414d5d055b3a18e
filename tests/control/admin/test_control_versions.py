"""The control API's versions at their edges (tiny model): a shutdown's drain is for good,
a weak ETag is a version, a patch that changes nothing makes none, a stale If-Match stops a
rollback or profile, and a reloaded file's lanes and profiles are the whole set."""

from __future__ import annotations

import asyncio

from fixtures.control_api import BASE, engine_for, generate, patch
from fixtures.serving import asgi_client, write_yaml

from control.admin.config_watch import ConfigWatcher


def test_a_server_shutting_down_says_draining_and_cannot_be_resumed(tiny_loaded, tmp_path):
    """SIGTERM's drain is for good: GET /control/config says so, and a resume is a 409 that
    leaves new requests refused (an operator's drain, by contrast, resumes)."""
    engine, settings = engine_for(tiny_loaded, tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            assert (await client.get("/control/config")).json()["admission"] == "open"
            engine.start_draining()  # what the lifespan does on SIGTERM
            assert (await client.get("/control/config")).json()["admission"] == "draining"
            resumed = await client.post("/control/resume", json={"reason": "oops"})
            assert resumed.status_code == 409, resumed.text
            assert resumed.json()["error"]["code"] == "shutting_down"
            refused = await generate(client, 0)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "draining"
    asyncio.run(scenario())


def test_a_weak_etag_is_a_version_and_an_unchanged_patch_makes_no_version(
        tiny_loaded, tmp_path):
    """If-Match as an HTTP client may send it back (W/"1"); a patch that changes nothing
    answers applied: false at the same version and adds no history entry."""
    engine, settings = engine_for(tiny_loaded, tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            weak = await client.patch("/control/config", json={
                "changes": {"max_num_seqs": 3}}, headers={"If-Match": 'W/"1"'})
            assert weak.status_code == 200, weak.text
            assert weak.json()["version"] == 2
            same = await patch(client, {"max_num_seqs": 3}, 2, reason="again")
            assert same.status_code == 200, same.text
            assert same.json()["applied"] is False and same.json()["version"] == 2
            assert same.json()["diff"] == {} and same.headers["etag"] == '"2"'
            history = (await client.get("/control/history")).json()["versions"]
            assert [v["version"] for v in history] == [1, 2]
            assert engine.live_config.version == 2
    asyncio.run(scenario())


def test_a_rollback_or_profile_with_a_stale_if_match_is_refused(tiny_loaded, tmp_path):
    """If-Match is optional on a rollback and a profile, but when sent it is checked: an
    operator acting on an old read must not undo a change made since."""
    engine, settings = engine_for(tiny_loaded, tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            assert (await patch(client, {"max_num_seqs": 3}, 1)).status_code == 200
            for path in ("/control/rollback/1", "/control/profiles/degrade"):
                stale = await client.post(path, json={}, headers={"If-Match": '"1"'})
                assert stale.status_code == 412, (path, stale.text)
                assert stale.json()["current_version"] == 2
            assert engine.live_config.version == 2 and engine.live_config.max_num_seqs == 3
            back = await client.post("/control/rollback/1", json={}, headers={"If-Match": '"2"'})
            assert back.status_code == 200 and back.json()["config"]["max_num_seqs"] == 4
    asyncio.run(scenario())


def test_a_reloaded_file_removes_the_lanes_it_dropped_and_brings_new_profiles(
        tiny_loaded, tmp_path):
    """The file's `lanes:` is the whole set: a lane it no longer names is removed; an edit
    of the profiles alone changes no setting, yet the new profiles are the ones served."""
    engine, settings = engine_for(tiny_loaded, tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            store = client.app.state.serving.config_store
            watcher = ConfigWatcher(store, settings.config_path)
            assert "long_context" in engine.live_config.lane_names
            fewer = {**BASE, "serving": {**BASE["serving"], "long_context_lane": None},
                     "lanes": {"interactive": {"weight": 4}, "batch": {"weight": 1}}}
            write_yaml(tmp_path / "serving.yaml", fewer)
            assert await watcher.reload() == 2, watcher.last_error
            assert engine.live_config.lane_names == ("interactive", "batch")
            profiles = {"degrade": {"max_num_seqs": 2}, "calm": {"max_num_seqs": 1}}
            write_yaml(tmp_path / "serving.yaml", {**fewer, "profiles": profiles})
            assert await watcher.reload() is None and watcher.last_error is None
            assert (await client.get("/control/config")).json()["profiles"] == profiles
            calm = await client.post("/control/profiles/calm", json={})
            assert calm.status_code == 200 and calm.json()["config"]["max_num_seqs"] == 1
    asyncio.run(scenario())
