"""What the ingress relays between a client and a replica (control/fleet/forward.py), over
stand-in handles (no Ray, no engine): the client's Host stays at the ingress; a replica's
status reaches the client as it said it; a stream cut ends with an error chunk in the
server's real content type and in a chat stream's own shape; a replica that takes a request
late is cancelled, one that fails after taking it is a 502, never a retry; a fan-out calls
the replicas it is given only, and survives one that does not answer."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from control.admin.origin_guard import OriginGuard
from control.fleet import forward
from control.fleet.asgi_call import call_asgi
from control.fleet.forward import NotAccepted, fan_out, open_call
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalCall
from control.fleet.router import RoutingPolicy

SSE = [("content-type", "text/event-stream")]


class Script:
    """One call's messages as a replica's handle streams them; then `fails` (raised), or a
    wait that only a cancel ends when `hangs`."""

    def __init__(self, messages: list[dict], fails: bool = False, hangs: bool = False):
        self.messages, self.fails, self.hangs = list(messages), fails, hangs
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> dict:
        await asyncio.sleep(0)
        if self.messages:
            return self.messages.pop(0)
        if self.hangs:
            await asyncio.Event().wait()
        if self.fails:
            raise RuntimeError("ActorDiedError: the actor died unexpectedly")
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class Handle:
    """A replica's handle: a call streams `script(method, path, query, headers, body)`;
    `calls` records each call's arguments."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def options(self, **_):
        return self

    @property
    def http(self):
        handle = self

        class Method:
            @staticmethod
            def remote(*args):
                handle.calls.append(args)
                return handle.script(*args)
        return Method


def app_replica(app: FastAPI) -> Handle:
    """A replica's handle over `app`, through call_asgi as EngineReplica.http serves it."""
    async def served(*args):
        yield {"accepted": 0}
        async for message in call_asgi(app, *args):
            yield message

    return Handle(lambda *args: LocalCall(served(*args)))  # cancel() as Serve's call has


def accepted(status: int, headers: list, *bodies: bytes) -> list[dict]:
    return [{"accepted": 0}, {"status": status, "headers": headers},
            *({"body": b} for b in bodies)]


def fleet_of(*handles: Handle) -> FleetIngress:
    """Routed as test_fleet_forward.py's fleet is: pow2 over two, replica 1 loaded, so a
    generation goes to replica 0 first."""
    fleet = FleetIngress(list(handles), RoutingPolicy(mode="pow2"), seed=0)
    for i in range(len(handles)):
        fleet.table.polled(i, {"ready": True, "running": 5 * i})
    return fleet


def ask(fleet: FleetIngress, method: str, path: str, **kw) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(fleet))
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            return await client.request(method, path, **kw)
    return asyncio.run(go())


def events(reply: httpx.Response) -> list[str]:
    return [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]


def test_a_replicas_error_status_and_headers_reach_the_client_as_it_said_them():
    """A 429 relayed as 200 would read as success to a client that checks the status (and
    would not back off); a 400 as 200 hides the client's own mistake."""
    for status, code in ((429, "rate_limited"), (400, "invalid_value")):
        body = json.dumps({"error": {"message": "no", "code": code}}).encode()
        replica = Handle(lambda *_, body=body, status=status: Script(accepted(
            status, [("content-type", "application/json"), ("retry-after", "2")], body)))
        reply = ask(fleet_of(replica), "POST", "/v1/completions", json={"prompt": "x"})
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["code"] == code
        assert reply.headers["retry-after"] == "2" and reply.headers["x-batchpilot-replica"] == "0"


def test_a_fleet_on_a_public_name_reaches_replicas_that_listen_on_loopback():
    """A replica started without tokens on loopback refuses a Host that is not a loopback
    name (421: control/admin/origin_guard.py); a call by handle sends none. The client's
    Host names the ingress, not the replica: passed on, every request would be a 421."""
    app = FastAPI()
    app.add_middleware(OriginGuard, check_host=True)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": []}

    reply = ask(fleet_of(app_replica(app)), "GET", "/v1/models",
                headers={"Host": "fleet.example.com:8000"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"object": "list", "data": []}


def test_a_stream_in_the_servers_own_content_type_ends_with_an_error_chunk():
    """The server's SSE responses say `text/event-stream; charset=utf-8` (Starlette adds the
    charset): a replica app that dies mid-stream, reached through call_asgi as a replica
    serves it, still ends the client's stream with an error chunk and [DONE]."""
    app = FastAPI()
    chunk = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1,
             "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]}

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def body():
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            raise RuntimeError("the engine died")
        return StreamingResponse(body(), media_type="text/event-stream")

    reply = ask(fleet_of(app_replica(app)), "POST", "/v1/chat/completions",
                json={"messages": []})
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    sent = events(reply)
    assert sent[-1] == "[DONE]" and len(sent) == 3, reply.text
    last = json.loads(sent[-2])
    assert last["id"] == "chatcmpl-7" and last["choices"][0]["finish_reason"] == "error"


@pytest.mark.parametrize("path,obj,empty", [
    ("/v1/chat/completions", "chat.completion.chunk", {"delta": {}}),
    ("/v1/completions", "text_completion", {"text": ""})])
def test_a_stream_cut_before_its_first_chunk_ends_in_its_own_shape(path, obj, empty):
    """No chunk came to copy the shape from: the path says it. A chat client reads
    `choices[0].delta`; a completions chunk there is one it cannot parse."""
    replica = Handle(lambda *_: Script(accepted(200, SSE), fails=True))
    reply = ask(fleet_of(replica), "POST", path, json={"prompt": "x", "messages": []})
    sent = events(reply)
    assert sent[-1] == "[DONE]" and len(sent) == 2, reply.text
    last = json.loads(sent[0])
    assert last["object"] == obj and last["id"].startswith("fleet-")
    assert last["choices"] == [{"index": 0, **empty, "logprobs": None,
                                "finish_reason": "error"}]
    assert last["error"]["code"] == "replica_failed"


def test_a_replica_that_takes_no_request_in_time_is_cancelled_and_called_late(monkeypatch):
    """Late, not failed: a busy replica is marked down only after several in a row
    (loads.py); cancelled, or it would still run the request the ingress retries
    elsewhere (the client's request run twice)."""
    monkeypatch.setattr(forward, "ACCEPT_TIMEOUT_S", 0.05)
    call = Script([], hangs=True)
    with pytest.raises(NotAccepted) as refused:
        asyncio.run(open_call(call, 0))
    assert refused.value.late, str(refused.value)
    assert call.cancelled


def test_a_replica_that_fails_after_taking_a_request_is_a_502_never_a_retry():
    """Once accepted the request may have run (tokens sampled, a tool called): it must not
    run again on another replica; the client gets the 502 and decides."""
    dies = Handle(lambda *_: Script([{"accepted": 0}], fails=True))
    other = Handle(lambda *_: Script(accepted(200, SSE, b"data: {}\n\n")))
    fleet = fleet_of(dies, other)
    reply = ask(fleet, "POST", "/v1/completions", json={"prompt": "x", "stream": True})
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["code"] == "replica_failed"
    assert reply.headers["retry-after"] == "1"
    assert len(dies.calls) == 1 and other.calls == []
    assert not fleet.table.views[0].healthy and fleet.table.views[1].healthy


METRICS = b'# TYPE batchpilot_steps_total counter\nbatchpilot_steps_total{model="m"} 5\n'


def test_the_fleets_metrics_answer_while_a_replica_does_not():
    """A replica restarting must not take the fleet's /metrics (every replica's) down."""
    up = Handle(lambda *_: Script(accepted(200, [("content-type", "text/plain")], METRICS)))
    down = Handle(lambda *_: Script([], fails=True))
    reply = ask(fleet_of(up, down), "GET", "/metrics")
    assert reply.status_code == 200, reply.text
    assert 'batchpilot_steps_total{model="m",replica="0"} 5.0' in reply.text


def test_a_fan_out_calls_only_the_replicas_it_is_given_each_with_body_and_headers():
    """`ids` are the replicas that may be called (live_ids): calling one autoscaling
    scaled in makes Serve start it again. Each gets the caller's headers (Authorization:
    a replica with tokens refuses a drain without it) and the body."""
    handles = [Handle(lambda *_: Script(accepted(200, [], b'{"ok": true}'))) for _ in range(3)]
    auth = [(b"authorization", b"Bearer admin-secret-1")]
    answers = asyncio.run(fan_out(handles, [0, 2], "POST", "/control/drain", b"{}", auth))
    assert answers == [(0, 200, b'{"ok": true}'), (2, 200, b'{"ok": true}')]
    assert handles[1].calls == []
    for i in (0, 2):
        [(method, path, _, headers, body)] = handles[i].calls
        assert (method, path, headers, body) == ("POST", "/control/drain", auth, b"{}")
