"""The fleet's trace read API at the ingress (control/fleet/trace_fanout.py) over stand-in
handles, no Ray: replica 0's trace holds the simulated workload (fixtures/trace_data: r0..r7
and "big"), replica 1's is empty (started, nothing run yet). A named replica answers alone,
and a named one that is down is not stood in for; a replica's 500 fails the read as a 502
naming it; a request is found on the one replica that ran it; a row question's window
reaches every replica. And the relay guard alone (`guard_forwarded`): load-test results need
an admin token however the path is spelled."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fixtures.trace_data import fill_trace
from starlette.requests import Request

from control.admin.auth import Token
from control.api.errors import APIError
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalCall, LocalHandle
from control.fleet.router import RoutingPolicy
from control.fleet.trace_fanout import guard_forwarded
from control.trace.writer import TraceSettings, TraceWriter

WORKLOAD = {"big", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}
# requests of the workload that finished at or after SINCE (fixtures/trace_data's clock)
SINCE, LATE = 1000001.1, {"r4", "r6", "r7"}


class TraceReplica:
    """A replica as the ingress reaches it by handle: the server's trace routes (and the
    export the ingress pulls aggregates by) over `writer`, through call_asgi."""

    def __init__(self, writer: TraceWriter, replica_id: int):
        from types import SimpleNamespace

        from fastapi import FastAPI

        from control.api.errors import install_error_handlers
        from control.trace import export_route, routes

        self.app, self.replica_id = FastAPI(), replica_id
        install_error_handlers(self.app)
        self.app.include_router(routes.router)
        self.app.include_router(export_route.router)
        self.app.state.serving = SimpleNamespace(trace=writer, metrics=None,
                                                 control_tokens=())

    async def http(self, method, path, query, headers, body):
        from control.fleet.asgi_call import call_asgi

        yield {"accepted": self.replica_id}
        async for message in call_asgi(self.app, method, path, query, headers, body):
            yield message


class Failing:
    """A replica's handle whose every call fails before it is accepted (`status` None:
    down or restarting), or answers `status` with a JSON error."""

    def __init__(self, status: int | None = None):
        self.status, self.calls = status, 0

    def options(self, **_):
        return self

    @property
    def http(self):
        return type("Method", (), {"remote": lambda *_: LocalCall(self.answer())})

    async def answer(self):
        self.calls += 1
        if self.status is None:
            raise RuntimeError("ActorDiedError: the actor died unexpectedly")
        yield {"accepted": 0}
        yield {"status": self.status, "headers": [["content-type", "application/json"]]}
        yield {"body": json.dumps({"error": {"message": "boom", "code": "internal"}}).encode()}


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fanout")
    ran = fill_trace(str(tmp / "replica-0.duckdb"), run_id="run-0")
    empty = TraceWriter(TraceSettings(str(tmp / "replica-1.duckdb")), "run-1", "tiny").start()
    yield ran, empty
    ran.stop()
    empty.stop()


def get(handles: list, *asks: tuple[str, dict]) -> list[httpx.Response]:
    """GET each (path, headers) at a tokenless fleet over `handles`, all polled healthy."""
    fleet = FleetIngress(handles, RoutingPolicy(), seed=0)
    for i in range(len(handles)):
        fleet.table.polled(i, {"ready": True})

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(fleet)),
                                     base_url="http://127.0.0.1", timeout=60) as client:
            return [await client.get(path, headers=headers) for path, headers in asks]

    return asyncio.run(go())


def replicas(writers) -> list:
    return [LocalHandle(TraceReplica(w, i)) for i, w in enumerate(writers)]


def ids(reply: httpx.Response) -> set[str]:
    assert reply.status_code == 200, reply.text
    return {row["request_id"] for row in reply.json()}


def test_a_named_replica_answers_its_own_trace_only(writers):
    fleet, one, other = get(replicas(writers), ("/v1/trace/slow?limit=100", {}),
                            ("/v1/trace/slow?limit=100", {"X-Batchpilot-Replica": "1"}),
                            ("/v1/trace/slow?limit=100", {"X-Batchpilot-Replica": "0"}))
    assert ids(fleet) == WORKLOAD and {r["replica"] for r in fleet.json()} == {"0"}
    assert one.json() == [] and one.headers["x-batchpilot-replica"] == "1"
    # as that replica answers it: its rows as they are, no `replica` label added
    assert ids(other) == WORKLOAD and "replica" not in other.json()[0]


def test_a_named_replica_that_is_down_is_a_503_never_another_replicas_trace(writers):
    """X-Batchpilot-Replica: 1 asks replica 1's trace; replica 0's rows answered in its
    place would read as replica 1's."""
    down = Failing()
    (reply,) = get([LocalHandle(TraceReplica(writers[0], 0)), down],
                   ("/v1/trace/slow", {"X-Batchpilot-Replica": "1"}))
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "replica_unavailable"
    assert "replica 1" in reply.json()["error"]["message"] and down.calls == 1


@pytest.mark.parametrize("path", ["/v1/trace/slow", "/v1/trace/summary"])
def test_a_replica_answering_500_fails_the_read_as_a_502_naming_it(writers, path):
    """The replica's fault, not the client's nor the ingress's: 502 naming it, with
    Retry-After (it may be restarting), as for one that does not answer at all."""
    (reply,) = get([LocalHandle(TraceReplica(writers[0], 0)), Failing(500)], (path, {}))
    assert reply.status_code == 502, reply.text
    error = reply.json()["error"]
    assert error["code"] == "replica_failed" and "replica 1 (500: boom)" in error["message"]
    assert reply.headers["retry-after"] == "1"


def test_a_request_is_found_on_the_one_replica_that_ran_it(writers):
    """Each request ran on one replica: the others' 404 is not the fleet's answer."""
    found, missing = get(replicas(writers), ("/v1/trace/requests/r1", {}),
                         ("/v1/trace/requests/no-such-request", {}))
    assert found.status_code == 200, found.text
    assert found.json()["replica"] == "0"
    assert found.json()["request"]["request_id"] == "r1"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_row_questions_window_reaches_every_replica(writers):
    """The fleet's rows are merged from each replica's answer to the same question: a
    replica asked without the window answers rows from outside it."""
    (late,) = get(replicas(writers), (f"/v1/trace/slow?since={SINCE}&limit=100", {}))
    assert ids(late) == LATE


# ---- the relay guard alone -------------------------------------------------------------
TOKENS = (Token("ops", "admin", "ops-secret-1"), Token("viewer", "read", "view-secret-1"))
RESULTS = ["/v1/loadtest/results", "/v1//loadtest/results", "/V1/LoadTest/Results",
           "/v1/loadtest/results/", "/v1/loadtest//results//"]


def relayed(path: str, secret: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": path, "query_string": b"",
                    "headers": [(b"authorization", f"Bearer {secret}".encode())]})


@pytest.mark.parametrize("path", RESULTS)
def test_load_test_results_need_an_admin_token_however_the_path_is_spelled(path):
    """The front door's own check (control/admin/origin_guard.py) matches the path as
    spelled; this guard is what stands for every other spelling a router in front of a
    replica may read as the same route, so it is tested alone: a read token is refused
    (and would write results the go-live checklist trusts), an admin token passes."""
    with pytest.raises(APIError) as refused:
        guard_forwarded(relayed(path, "view-secret-1"), TOKENS)
    assert refused.value.status == 403 and "admin" in refused.value.message
    guard_forwarded(relayed(path, "ops-secret-1"), TOKENS)
