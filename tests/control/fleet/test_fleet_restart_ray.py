"""`batchpilot fleet restart` on local Ray (the 2-replica fleet of conftest.py's fixture)
while closed-loop clients send requests, streamed and not: every request succeeds, both
replicas come back as new processes, and the fleet's config version is the same and
converged afterwards. Skipped without Ray Serve, as test_fleet_ray.py is.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.control.fleet.test_fleet_ray import ray  # noqa: F401  (skips without Ray)

pytestmark = pytest.mark.timeout(300)
CLIENTS = 3
THINK_S = 0.05  # between one client's requests


def _one(client: httpx.Client, cid: int, i: int) -> tuple[bool, str]:
    """One request; -> (it ended normally with every token, what went wrong)."""
    body = {"prompt": f"Client {cid} asks question {i}", "max_tokens": 12,
            "ignore_eos": True, "stream": i % 2 == 1}
    headers = {"X-Tenant": f"t{cid}-{i % 3}"}
    if not body["stream"]:
        resp = client.post("/v1/completions", headers=headers, json=body)
        ok = resp.status_code == 200 and \
            resp.json()["choices"][0]["finish_reason"] == "length"
        return ok, f"{resp.status_code} {resp.text[:200]}"
    with client.stream("POST", "/v1/completions", headers=headers, json=body) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    last = json.loads(events[-2]) if len(events) >= 2 else {}
    ok = resp.status_code == 200 and events[-1:] == ["[DONE]"] and \
        last.get("choices", [{}])[0].get("finish_reason") == "length"
    return ok, f"{resp.status_code} {events[-2:]}"


def _load(url: str, stop: threading.Event, cid: int, results: list) -> None:
    """Requests one after another, THINK_S apart: requests are in flight through every
    drain, at about half the CPU of a loop with no pause (make test's time)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        i = 0
        while not stop.wait(THINK_S):
            try:
                results.append((time.monotonic(), *_one(client, cid, i)))
            except httpx.HTTPError as exc:
                results.append((time.monotonic(), False, repr(exc)))
            i += 1


def _converged_config(url: str, timeout_s: float = 30.0) -> dict:
    """GET /control/config once every replica runs its version (a replica an earlier test
    killed comes back on version 0 and is pushed the fleet's within a second or so)."""
    deadline = time.monotonic() + timeout_s
    while True:
        config = httpx.get(f"{url}/control/config", timeout=10).json()
        if config["converged"]:
            return config
        assert time.monotonic() < deadline, f"the fleet did not converge: {config}"
        time.sleep(0.2)


def test_a_rolling_restart_under_load_drops_no_request(fleet, capsys):
    from control.cli.main import main

    before = httpx.get(f"{fleet}/readyz", timeout=10).json()["replicas"]
    config = _converged_config(fleet)
    if config["version"] == 0:  # so a restarted replica (it starts on 0) must be pushed
        changed = httpx.patch(f"{fleet}/control/config", headers={"If-Match": "0"}, json={
            "changes": {"max_num_seqs": 8}, "reason": "restart test"}, timeout=30)
        assert changed.status_code == 200, changed.text
        config = _converged_config(fleet)
    stop, results = threading.Event(), []
    clients = [threading.Thread(target=_load, args=(fleet, stop, i, results), daemon=True)
               for i in range(CLIENTS)]
    for t in clients:
        t.start()
    try:
        time.sleep(1.0)  # the load is flowing on both replicas
        start = time.monotonic()
        code = main(["fleet", "restart", "--url", fleet, "--grace", "20", "--timeout", "120"])
        end = time.monotonic()
        time.sleep(1.0)  # and flows on both after
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    out = capsys.readouterr().out
    during = [r for r in results if start <= r[0] <= end]
    errors = [r for r in results if not r[1]]
    with capsys.disabled():  # the figures bench/RESULTS.md records
        print(f"\n{out}requests: {len(results)} in all, {len(during)} during the restart"
              f" ({end - start:.1f} s), {len(errors)} failed")
    assert code == 0, out
    assert not errors, errors[:3]
    assert len(during) >= 10
    after = httpx.get(f"{fleet}/readyz", timeout=10).json()["replicas"]
    assert all(r["healthy"] and r["routable"] for r in after)
    for old, new in zip(before, after, strict=True):
        assert new["incarnation"] != old["incarnation"] and new["pid"] != old["pid"]
    now = httpx.get(f"{fleet}/control/config", timeout=10).json()
    assert now["version"] == config["version"] and now["converged"]
    assert now["config"] == config["config"]
    run = httpx.get(f"{fleet}/control/fleet/restart", timeout=10).json()["restart"]
    assert run["status"] == "done" and run["aborted"] == 0
    assert [s["replica_id"] for s in run["steps"]] == [0, 1]
