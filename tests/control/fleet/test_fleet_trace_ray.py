"""The Ray fleet's traces read as one through its ingress (conftest.py's shared fleet,
each replica writing DIR/replica-<id>.duckdb): `batchpilot trace --url INGRESS` counts
every replica's requests, labels rows with their replica, and `--replica` picks one."""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
import pytest

from control.cli.main import main

pytestmark = pytest.mark.timeout(300)


def trace(capsys, *argv: str):
    code = main(["trace", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def finished(capsys, url: str, *extra: str) -> int:
    summary = trace(capsys, "--url", url, *extra, "summary", "--json")
    return sum(o["requests"] for o in summary["outcomes"])


def test_the_fleet_trace_reads_as_one_through_the_ingress(fleet, capsys):
    before = finished(capsys, fleet)
    served: Counter[str] = Counter()
    with httpx.Client(base_url=fleet, timeout=60) as client:
        for i in range(12):  # tenants spread over both replicas (affinity, rendezvous hash)
            resp = client.post("/v1/completions", headers={"X-Tenant": f"trace-{i}"},
                               json={"prompt": f"trace read {i}", "max_tokens": 4,
                                     "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            served[resp.headers["x-batchpilot-replica"]] += 1
    assert set(served) == {"0", "1"}, served
    deadline = time.monotonic() + 30  # each replica's writer commits within its interval
    while finished(capsys, fleet) < before + 12:
        assert time.monotonic() < deadline, "the fleet trace never counted the 12 requests"
        time.sleep(0.5)
    slow = trace(capsys, "--url", fleet, "slow", "--limit", "200", "--json")
    assert {r["replica"] for r in slow} == {"0", "1"}
    per_replica = [finished(capsys, fleet, "--replica", rid) for rid in ("0", "1")]
    assert sum(per_replica) == finished(capsys, fleet)  # the fleet is its replicas' sum
