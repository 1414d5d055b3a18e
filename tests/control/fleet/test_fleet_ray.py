"""`batchpilot fleet` on a local Ray: two replicas of the tiny model behind one ingress.

One Ray and one fleet for the whole session (tests/control/fleet/conftest.py's `fleet`,
shared with the canary and restart tests); the tests run in order, the replica kill last.
Skipped when Ray Serve is not installed, except under CI (`make test` installs the `fleet`
extra).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from fixtures.requires import require_module

ray = require_module("ray", "pip install -e '.[fleet]'")  # the fleet fixture: conftest.py's

pytestmark = pytest.mark.timeout(240)
LONG_TOKENS = 360  # + the 124-token prompt fits max_model_len 512; seconds a stream
SYSTEM = "You are the scheduler's assistant. Each block of the cache holds sixteen tokens. " * 4
assert len(SYSTEM) > 256  # longer than the prefix affinity hashes (RoutingPolicy.prefix_chars)


def _readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=10).json()


def _ready_replicas(url: str) -> int:
    try:
        return sum(r["healthy"] for r in _readyz(url)["replicas"])
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _events(lines: list[str]) -> list:
    return [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]"
            for x in lines if x.startswith("data: ")]


def test_one_url_serves_the_openai_api_and_the_probes(fleet):
    with httpx.Client(base_url=fleet, timeout=60) as client:
        # ignore_eos: the tiny model samples EOS now and then (seen: 2 tokens of 4)
        done = client.post("/v1/completions", json={"prompt": "The scheduler", "max_tokens": 4,
                                                    "ignore_eos": True})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
        assert done.headers["x-batchpilot-replica"] in ("0", "1")
        with client.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "stream": True}) as resp:
            events = _events(list(resp.iter_lines()))
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        bad = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"
        lane = client.post("/v1/completions", headers={"X-Lane": "no-such-lane"},
                           json={"prompt": "x", "max_tokens": 2})  # the header got through
        assert lane.status_code == 400 and lane.json()["error"]["param"] == "X-Lane"
        model = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
        assert model.status_code == 404 and model.json()["error"]["code"] == "model_not_found"
        assert client.get("/v1/models").json()["data"][0]["id"]
        assert client.get("/healthz").json() == {"status": "ok"}
        metrics = client.get("/metrics").text
        assert 'replica="0"' in metrics and 'replica="1"' in metrics
        assert metrics.count("# TYPE batchpilot_prefix_cache_hits_total counter") == 1


def test_a_shared_prefix_stays_on_one_replica_and_keys_use_both(fleet):
    with httpx.Client(base_url=fleet, timeout=60) as client:
        def replica(prompt: str, tenant: str) -> str:
            resp = client.post("/v1/completions", headers={"X-Tenant": tenant},
                               json={"prompt": prompt, "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            return resp.headers["x-batchpilot-replica"]

        same = {replica(SYSTEM + f"Question {i}?", "acme") for i in range(5)}
        spread = {replica(SYSTEM + "Question?", f"tenant-{i}") for i in range(12)}
    assert len(same) == 1  # sequential: the load never passes the imbalance
    assert spread == {"0", "1"}  # a new tenant holds no blocks: affinity places it
    decisions = _readyz(fleet)["decisions"]
    assert decisions.get("affinity", 0) + decisions.get("precise", 0) >= 17
    # --routing precise: once the ingress's index has the holder's blocks (KV events over
    # Serve's handles), acme's next request goes there on them
    holder = int(same.pop())
    _wait(lambda: _readyz(fleet)["kv_index"][holder]["blocks"] > 0, 30, "KV events")
    with httpx.Client(base_url=fleet, timeout=60) as client:
        resp = client.post("/v1/completions", headers={"X-Tenant": "acme"},
                           json={"prompt": SYSTEM + "Question 9?", "max_tokens": 2})
    assert int(resp.headers["x-batchpilot-replica"]) == holder
    after = _readyz(fleet)["decisions"]
    assert after.get("precise", 0) == decisions.get("precise", 0) + 1, (decisions, after)


async def _stream(client: httpx.AsyncClient, tenant: str, started: asyncio.Event | None,
                  leave_after: int | None = None) -> tuple[str, list]:
    async with client.stream("POST", "/v1/completions", headers={"X-Tenant": tenant}, json={
            "prompt": SYSTEM, "max_tokens": LONG_TOKENS, "ignore_eos": True,
            "stream": True}) as resp:
        assert resp.status_code == 200
        replica, lines = resp.headers["x-batchpilot-replica"], []
        async for line in resp.aiter_lines():
            lines.append(line)
            if started is not None and line.startswith("data: {"):
                started.set()
            if leave_after is not None and len(_events(lines)) >= leave_after:
                return replica, _events(lines)  # closes the connection mid-stream
    return replica, _events(lines)


def _idle(url: str, replica: int) -> bool:
    stats = _readyz(url)["replicas"][replica]
    return stats["healthy"] and stats["running"] == 0 and stats["kv_blocks_used"] == 0


def test_a_client_that_leaves_frees_its_kv_on_the_replica(fleet):
    async def scenario():
        async with httpx.AsyncClient(base_url=fleet, timeout=60) as client:
            return await _stream(client, "leaver", None, leave_after=3)

    replica, events = asyncio.run(scenario())
    assert len(events) == 3
    _wait(lambda: _idle(fleet, int(replica)), 30, "the left stream's KV to be freed")


def test_a_killed_replica_fails_its_streams_and_comes_back(fleet):
    victim = 0
    old_pid = _readyz(fleet)["replicas"][victim]["pid"]
    tenants = [f"tenant-{i}" for i in range(12)]  # both replicas get some (test above)

    async def scenario():
        async with httpx.AsyncClient(base_url=fleet, timeout=120) as client:
            started = [asyncio.Event() for _ in tenants]
            streams = [asyncio.ensure_future(_stream(client, t, e))
                       for t, e in zip(tenants, started, strict=True)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            os.kill(old_pid, signal.SIGKILL)  # tokens are flowing on both replicas
            await asyncio.sleep(0.5)
            after = [await client.post("/v1/completions", headers={"X-Tenant": t},
                                       json={"prompt": SYSTEM, "max_tokens": 2})
                     for t in tenants[:4]]
            return await asyncio.gather(*streams), after

    results, after = asyncio.run(scenario())
    by_replica: dict[str, list] = {"0": [], "1": []}
    for replica, events in results:
        by_replica[replica].append(events)
    assert by_replica["0"] and by_replica["1"], "the streams should use both replicas"
    for events in by_replica["0"]:  # cut short, with a clear error as the last chunk
        last = events[-2]
        assert events[-1] == "[DONE]" and last["choices"][0]["finish_reason"] == "error"
        assert last["error"]["code"] == "replica_failed" and "replica 0" in \
            last["error"]["message"]
    for events in by_replica["1"]:  # untouched: every token, a normal end
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert [r.status_code for r in after] == [200] * 4  # routed to the survivor
    assert {r.headers["x-batchpilot-replica"] for r in after} == {"1"}
    _wait(lambda: _idle(fleet, 1), 30, "the survivor to hold no KV")
    _wait(lambda: _ready_replicas(fleet) == 2, 90, "Ray Serve to restart replica 0")
    ready = _readyz(fleet)
    rows = ready["replicas"]
    assert rows[victim]["pid"] != old_pid
    # the new process is a new KV-event epoch: the ingress's index took a snapshot of it
    _wait(lambda: _readyz(fleet)["kv_index"][victim]["snapshots"] >= 2, 10, "a snapshot")
    # every call to the dead process ended (none hangs, none is still counted against it)
    assert [r["ingress_inflight"] for r in rows] == [0, 0]
    again = httpx.post(f"{fleet}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                       timeout=60)
    assert again.status_code == 200
