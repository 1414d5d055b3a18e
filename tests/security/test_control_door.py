"""The door of the control plane, with tokens: a caller without a valid token gets a 401
before anything reads its body (a 400 about the body would tell it what the route expects);
a token bound to a tenant reads neither the config (which names every tenant's lane) nor
its history (every change's actor and reason); Host, Origin and Authorization count only
when sent once. And on the data plane: X-Priority wins over the body's `priority` (a
gateway that sets it decides), and a routing header sent twice is a 400."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.serving import asgi_client, make_engine, tokens_file

from control.serve.settings import ServeSettings

SECRET_TENANT = "beta-bigcorp-secret-customer"
TOKENS = ("ops admin ops-secret-1\nacme-ro read acme-secret1 acme\n"
          "viewer read view-secret-1\n")
ADMIN = {"Authorization": "Bearer ops-secret-1"}
ACME = {"Authorization": "Bearer acme-secret1"}
VIEWER = {"Authorization": "Bearer view-secret-1"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def served(tiny_loaded, tmp_path_factory):
    with tokens_file(tmp_path_factory.mktemp("door"), TOKENS) as tokens:
        engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
            model="tiny", control_tokens_path=str(tokens)))
        yield engine, settings
        engine.stop()


def _calls(served, calls: list[tuple[str, str, dict, bytes | None]]) -> list:
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return [await client.request(method, path, headers=headers, content=body)
                    for method, path, headers, body in calls]

    return asyncio.run(scenario())


def test_no_token_is_a_401_before_the_body_is_read(served):
    replies = _calls(served, [
        ("PATCH", "/control/config", JSON, b'{"zzz": 1}'),
        ("POST", "/control/drain", JSON, b"{not json"),
        ("POST", "/v1/whatif", JSON, b"[]"),
        ("PATCH", "/control/config", {**JSON, "Authorization": "Bearer wrong"}, b'{"zzz": 1}'),
    ])
    for reply in replies:
        assert reply.status_code == 401, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "unauthorized"
        assert "zzz" not in reply.text and "JSON" not in reply.text


def test_a_read_token_on_a_change_is_a_403_before_the_body_is_read(served):
    replies = _calls(served, [
        ("PATCH", "/control/config", {**JSON, **VIEWER, "If-Match": "0"}, b'{"changes": 5}'),
        ("POST", "/control/rollback/abc", {**JSON, **VIEWER}, b"{}"),
        ("POST", "/control/drain", {**JSON, **VIEWER}, b"{not json"),
        ("POST", "/v1/loadtest/results", {**JSON, **VIEWER}, b"[]"),
    ])
    for reply in replies:
        assert reply.status_code == 403, reply.text
        assert "read-only" in reply.json()["error"]["message"]


def test_a_tenant_bound_token_reads_no_config_and_no_history(served):
    engine, settings = served
    change = {"changes": {"tenant_lanes": {SECRET_TENANT: "batch"}},
              "reason": f"move {SECRET_TENANT} to batch"}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            version = (await client.get("/control/config", headers=ADMIN)).json()["version"]
            moved = await client.patch("/control/config", json=change,
                                       headers={**ADMIN, "If-Match": str(version)})
            assert moved.status_code == 200, moved.text
            return ([await client.get(p, headers=ACME) for p in ("/control/config",
                                                                 "/control/history")],
                    [await client.get(p, headers=ADMIN) for p in ("/control/config",
                                                                  "/control/history")])

    bound, admin = asyncio.run(scenario())
    for reply in bound:
        assert reply.status_code == 403, reply.text
        assert SECRET_TENANT not in reply.text
        assert reply.json()["error"]["code"] == "forbidden"
    for reply in admin:  # an unbound token reads it: the search above can find it
        assert reply.status_code == 200 and SECRET_TENANT in reply.text, reply.text


@pytest.mark.parametrize("header", ["Host", "Origin", "Authorization"])
def test_a_door_header_sent_twice_is_a_400(served, header):
    engine, settings = served
    values = {"Host": ["127.0.0.1", "evil.example"], "Origin": ["http://127.0.0.1",
              "http://evil.example"], "Authorization": ["Bearer ops-secret-1", "Bearer x"]}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            request = client.build_request("GET", "/control/config", headers=ADMIN)
            request.headers = request.headers.copy()
            raw = [(k, v) for k, v in request.headers.raw if k.lower() != header.lower().encode()]
            raw += [(header.encode(), v.encode()) for v in values[header]]
            request.headers = type(request.headers)(raw)
            return await client.send(request)

    reply = asyncio.run(scenario())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == header


@pytest.mark.parametrize("host", ["127.0.0.1:8000, evil.example", "localhost/evil",
                                  "evil@localhost"])
def test_a_host_that_is_not_one_name_is_a_400(served, host):
    reply = _calls(served, [("GET", "/control/config", {**ADMIN, "Host": host}, None)])[0]
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "Host"


def test_x_priority_wins_over_the_body_and_a_routing_header_twice_is_a_400(served):
    engine, settings = served
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "priority": -2**31}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            ruled = await client.post("/v1/completions", json=body,
                                      headers={"X-Priority": "5"})
            request = client.build_request("POST", "/v1/completions", json=body)
            request.headers = type(request.headers)(
                [*request.headers.raw, (b"X-Tenant", b"acme"), (b"X-Tenant", b"beta")])
            return ruled, await client.send(request)

    ruled, twice = asyncio.run(scenario())
    assert ruled.status_code == 200, ruled.text
    assert ruled.json()["batchpilot"]["priority"] == 5
    assert twice.status_code == 400 and twice.json()["error"]["param"] == "X-Tenant"


def test_a_body_priority_outside_32_bits_is_a_400_naming_it(served):
    """The body's `priority` has X-Priority's range, [-2**31, 2**31): one past either end is
    a 400 naming `priority`, as the header's is; the ends themselves are served."""
    engine, settings = served
    base = {"model": "tiny", "prompt": "hi", "max_tokens": 2}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return [await client.post("/v1/completions", json={**base, "priority": value})
                    for value in (2**31, -2**31 - 1, 2**31 - 1)]

    over, under, top = asyncio.run(scenario())
    for reply in (over, under):
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "priority"
    assert top.status_code == 200 and top.json()["batchpilot"]["priority"] == 2**31 - 1


def test_a_bad_setting_is_a_400_that_names_it(served):
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            version = (await client.get("/control/config", headers=ADMIN)).json()["version"]
            return await client.patch("/control/config", json={"changes": {
                "max_num_seqs": "64"}}, headers={**ADMIN, "If-Match": str(version)})

    reply = asyncio.run(scenario())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "max_num_seqs", reply.text
