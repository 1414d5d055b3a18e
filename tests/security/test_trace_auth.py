"""Every route that reads or writes the trace needs a token whenever the server has tokens,
whatever flags turned other routes off: the routes are enumerated from the app itself
(/v1/trace/*, /v1/loadtest/*, /v1/whatif), so a route added later is covered too.

    no token                          401, before any parameter is looked at
    a read token                      200, or the route's own 4xx (a missing request: 404)
    a query parameter it does not take  400 naming it (after the token check)
    a read token on the one write     403 (POST /v1/loadtest/results needs admin)
    a token bound to tenants          403 where the answer is the server's, not theirs
/metrics stays open (Prometheus scrapes it; its tenant labels are bounded)."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest
from fixtures.app_routes import api_routes
from fixtures.serving import asgi_client, make_engine
from starlette.requests import Request

from control.admin.auth import ENV_VAR, parse_tokens
from control.api.errors import APIError
from control.loadtest.metrics import summarize
from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.store import rows_for_api
from control.serve.settings import ServeSettings
from control.trace.routes import trace_admin, trace_reader

GUARDED = ("/v1/trace", "/v1/loadtest", "/v1/whatif")
ADMIN_ONLY = {("POST", "/v1/loadtest/results")}
# the routes that show the server's config or every tenant's data: 403 for a bound token
SERVER_WIDE = {("GET", "/v1/trace/config_changes"), ("GET", "/v1/trace/checklist"),
               ("GET", "/v1/loadtest/runs"), ("GET", "/v1/loadtest/stats"),
               ("POST", "/v1/whatif"), ("POST", "/v1/loadtest/results")}
PATH_VALUES = {"table": "requests", "kind": "steps", "request_id": "no-such-request"}
ADMIN, READ, BOUND = ("Bearer ops-secret-1", "Bearer view-secret-1", "Bearer acme-secret1")


def _results_body() -> dict:
    results = [RequestResult(PlannedRequest(index=i, arrival_s=0.0, prompt_tokens=8,
                                            output_tokens=4, tenant="acme", lane=None,
                                            stream=True, cancel_after_s=None),
                             "ok", 200, sent_at=1000.0 + i,
                             ttft_s=0.1, e2e_s=0.5, chunk_times_s=[0.1, 0.5],
                             prompt_tokens=8, output_tokens=2) for i in range(2)]
    rows = rows_for_api("run-x", "tiny", "cfg", "http://x", summarize(results, 1.0, None,
                                                                      "cfg"), results)
    return {"runs": [rows]}


BODIES = {"/v1/whatif": {"set": {"max_num_seqs": 2}}, "/v1/loadtest/results": None}


@pytest.fixture(params=[True, False], ids=["control-api", "no-control-api"])
def served(request, tiny_loaded, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text("ops admin ops-secret-1\nviewer read view-secret-1\n"
                      "acme-ro read acme-secret1 acme\n")
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", control_api=request.param, control_tokens_path=str(tokens),
        trace_db=str(tmp_path / "trace.duckdb")))
    return engine, settings


def guarded_routes(app) -> list[tuple[str, str]]:
    """(method, concrete path) of every trace, load-test and what-if route of `app`."""
    found = []
    for path, route in api_routes(app.routes):
        if path.startswith(GUARDED):
            path = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: PATH_VALUES[m.group(1)], path)
            found += [(method, path) for method in sorted(route.methods)]
    return found


def _call(client, method: str, path: str, auth: str | None, extra: dict | None = None):
    headers = {"Authorization": auth} if auth else {}
    template = next((p for p in BODIES if path == p), None)
    body = (BODIES[template] or _results_body()) if template else None
    params = {"at": "0"} if path == "/v1/trace/steps/around" else {}  # its one required
    return client.request(method, path, params={**params, **(extra or {})}, json=body,
                          headers=headers)


def _every_route(served, auth_by_case, extra: dict | None = None):
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            routes = guarded_routes(client.app)
            out = {}
            for case, auth in auth_by_case.items():
                out[case] = {r: await _call(client, *r, auth, extra) for r in routes}
            out["metrics"] = await client.get("/metrics")
            client.app.state.serving.trace.stop()
            return routes, out

    return asyncio.run(scenario())


def test_every_trace_route_needs_a_token(served):
    routes, out = _every_route(served, {"none": None, "wrong": "Bearer not-a-token1",
                                        "read": READ, "admin": ADMIN})
    assert len(routes) >= 17, routes  # the enumeration found the trace API
    for route in routes:
        for case in ("none", "wrong"):
            reply = out[case][route]
            assert reply.status_code == 401, (case, route, reply.text)
            assert reply.headers["WWW-Authenticate"] == "Bearer"
        read = out["read"][route]
        if route in ADMIN_ONLY:
            assert read.status_code == 403, (route, read.text)
            assert out["admin"][route].status_code == 200, (route, out["admin"][route].text)
        else:  # its answer, or its own 4xx: never a refusal of the token
            assert read.status_code not in (401, 403), (route, read.text)
            assert read.status_code == 200 or read.json()["error"]["code"] in (
                "not_found", "invalid_value"), (route, read.text)
    assert out["metrics"].status_code == 200  # scraped without a token


def test_a_query_parameter_the_route_does_not_take_is_a_400_after_the_token(served):
    """`?sinse=-15m` answered for all time before: every trace, load-test and what-if route
    now names the unknown parameter and the ones it takes, once the token passed."""
    routes, out = _every_route(served, {"none": None, "admin": ADMIN}, {"sinse": "-15m"})
    for route in routes:
        assert out["none"][route].status_code == 401, (route, out["none"][route].text)
        reply = out["admin"][route]
        assert reply.status_code == 400, (route, reply.text)
        error = reply.json()["error"]
        assert error["param"] == "sinse" and "unknown query parameter sinse" in error[
            "message"], (route, error)


def test_a_query_parameter_in_another_case_is_unknown(served):
    """FastAPI matches `since` as spelt: `?Since=-15m` would be ignored and the summary cover
    all time, so it is refused like any other parameter the route does not take."""
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            reply = await client.get("/v1/trace/summary", params={"Since": "-15m"},
                                     headers={"Authorization": READ})
            client.app.state.serving.trace.stop()
            return reply

    reply = asyncio.run(scenario())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "Since"


def test_the_control_api_refuses_an_unknown_query_parameter_and_openai_routes_ignore_it(
        served):
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            history = await client.get("/control/history", params={"limit": "5"},
                                       headers={"Authorization": ADMIN})
            models = await client.get("/v1/models", params={"api-version": "2024-02-01"},
                                      headers={"Authorization": ADMIN})
            return history, models

    history, models = asyncio.run(scenario())
    if settings.control_api:
        assert history.status_code == 400 and history.json()["error"]["param"] == "limit"
        assert "takes no query parameters" in history.json()["error"]["message"]
    assert models.status_code == 200, models.text  # Azure-style clients send api-version


def test_a_tenant_bound_token_may_not_read_what_is_the_servers(served):
    routes, out = _every_route(served, {"bound": BOUND})
    assert set(routes) >= SERVER_WIDE
    for route in routes:
        reply = out["bound"][route]
        if route in SERVER_WIDE:
            assert reply.status_code == 403, (route, reply.text)
            assert route in ADMIN_ONLY or "bound to tenants" in reply.json()["error"][
                "message"], (route, reply.text)
        else:
            assert reply.status_code not in (401, 403), (route, reply.text)


def test_a_bound_token_may_not_export_the_config_audit_or_load_tests(served):
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            replies = {t: await client.get(f"/v1/trace/export/{t}",
                                           headers={"Authorization": BOUND})
                       for t in ("config_changes", "loadtest_runs", "loadtest_requests",
                                 "requests", "steps")}
            client.app.state.serving.trace.stop()
            return replies

    replies = asyncio.run(scenario())
    assert [replies[t].status_code for t in replies] == [403, 403, 403, 200, 200]


def test_a_refused_token_is_typed_as_the_clients_error(served):
    """A 401 is typed as OpenAI types a bad API key (invalid_request_error), a 403 as
    permission_error: never server_error, which an SDK retries as the server's fault."""
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            return (await client.get("/v1/trace/summary"),
                    await client.get("/v1/trace/config_changes",
                                     headers={"Authorization": BOUND}))

    missing, bound = asyncio.run(scenario())
    assert (missing.status_code, missing.json()["error"]["type"]) == (401,
                                                                      "invalid_request_error")
    assert (bound.status_code, bound.json()["error"]["type"]) == (403, "permission_error")


def test_the_results_route_checks_the_admin_scope_itself_behind_the_guard():
    """The origin guard refuses a read token on POST /v1/loadtest/results before the body
    is read (the test above); the route's own dependency refuses it too, so a path left
    out of the guard's prefixes stays closed."""
    tokens = parse_tokens(["ops admin ops-secret-1", "viewer read view-secret-1"],
                          "test")

    def request(auth: str) -> Request:
        app = SimpleNamespace(state=SimpleNamespace(serving=SimpleNamespace(
            control_tokens=tokens)))
        return Request({"type": "http", "method": "POST", "path": "/v1/loadtest/results",
                        "headers": [(b"authorization", auth.encode())], "query_string": b"",
                        "app": app})

    assert trace_admin(request(ADMIN)).name == "ops"
    assert trace_reader(request(READ)).name == "viewer"
    with pytest.raises(APIError) as refused:
        trace_admin(request(READ))
    assert refused.value.status == 403


def test_results_with_a_value_of_the_wrong_type_are_a_400_and_store_nothing(served):
    """A string where the trace stores a number fails in the insert (pyarrow's TypeError
    or ValueError, not DuckDB's): a 400 naming `runs`, never a 500 or a half-stored run."""
    engine, settings = served
    body = _results_body()
    body["runs"][0]["loadtest_requests"][0]["ttft_s"] = "fast"

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            reply = await client.post("/v1/loadtest/results", json=body,
                                      headers={"Authorization": ADMIN})
            runs = await client.get("/v1/loadtest/runs", headers={"Authorization": ADMIN})
            client.app.state.serving.trace.stop()
            return reply, runs

    reply, runs = asyncio.run(scenario())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "runs"
    assert runs.status_code == 200 and runs.json() == [], runs.text


SPELLINGS = ["/v1//loadtest/results", "/V1/LoadTest/Results", "/v1/loadtest/results/",
             "/v1/loadtest//results//", "/v1/loadtest/%72esults", "/v1/./loadtest/results"]


def test_a_read_token_stores_no_results_however_the_path_is_spelled(served):
    """The fleet's relay guard is tested on these spellings (test_fleet_trace_fanout.py);
    a single server matches routes as spelled, so each is refused (403), unknown (404) or
    redirected (307, which the client's next POST meets the route's own check) and the
    trace holds no run a read-only caller sent."""
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            replies = {path: await client.post(path, json=_results_body(),
                                               headers={"Authorization": READ})
                       for path in SPELLINGS}
            runs = await client.get("/v1/loadtest/runs", headers={"Authorization": ADMIN})
            client.app.state.serving.trace.stop()
            return replies, runs

    replies, runs = asyncio.run(scenario())
    for path, reply in replies.items():
        assert reply.status_code in (307, 403, 404), (path, reply.status_code, reply.text)
    assert runs.status_code == 200 and runs.json() == [], runs.text
