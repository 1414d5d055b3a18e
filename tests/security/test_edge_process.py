"""The edge process (control/edge/): `batchpilot serve --edge on` answers malformed requests
from a process of its own, with the server's own 4xx bodies, while the engine's process is
not even running; valid requests pass through streamed, a client that goes away frees its
request at the server, arrival counts from the edge, and the edge's death stops the server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from fixtures.serving import ServerProcess, sse_events

from control.api.arrival import ARRIVAL_KEY, EDGE_ELAPSED_HEADER, StampArrival
from control.serve.settings import ServeSettings

CONFIG = {"serving": {"num_kv_blocks": 256}}
MALFORMED = [  # (path, body, status, param named in the error)
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "x"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4', 400, None),  # truncated JSON
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400, None),  # deep nesting
    ("/v1/completions", json.dumps({"prompt": "hi", "stop": ["s"] * 5000}).encode(), 400,
     "stop"),
    ("/v1/chat/completions", b'{"messages": "not a list"}', 400, "messages"),
    ("/tokenize", b'{"prompt": 5}', 400, "prompt"),
    ("/detokenize", b'{"tokens": "abc"}', 400, "tokens"),
    ("/detokenize", json.dumps({"tokens": [5] * 200_000}).encode(), 400, "tokens"),
]


@pytest.fixture(scope="module")
def edged(tiny_llama_dir, tmp_path_factory):
    with ServerProcess(tiny_llama_dir, tmp_path_factory.mktemp("edge"), CONFIG,
                       "--edge", "on", "--dtype", "float32") as server:
        yield server


def server_pid(server: ServerProcess) -> int:
    assert server.proc is not None
    return server.proc.pid


def edge_pid(server: ServerProcess) -> int:
    line = next(x for x in server.log().splitlines() if x.strip().startswith("edge:"))
    return int(line.split("(pid ")[1].split(")")[0])


def listening_tcp() -> dict[int, str]:
    """The network namespace's listening TCP sockets: port -> socket inode."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return {int(r.split()[1].split(":")[1], 16): r.split()[9] for r in rows
            if r.split()[3] == "0A"}


def test_the_server_listens_only_behind_its_edge(edged):
    port = int(edged.url.rsplit(":", 1)[1])
    assert edge_pid(edged) != server_pid(edged)
    listeners = listening_tcp()
    assert port in listeners
    # the engine's process holds no TCP listener of its own (its socket is a Unix one)
    fd_dir = Path(f"/proc/{server_pid(edged)}/fd")
    inodes = {target[len("socket:["):-1] for target in map(os.readlink, fd_dir.iterdir())
              if target.startswith("socket:[")}
    assert not inodes & set(listeners.values()), "the server process listens on TCP itself"


def test_malformed_requests_are_refused_while_the_engine_process_is_stopped(edged):
    with httpx.Client(base_url=edged.url, timeout=30) as client:
        direct = [client.post(p, content=b, headers={"Content-Type": "application/json"})
                  for p, b, _, _ in MALFORMED]
        os.kill(server_pid(edged), signal.SIGSTOP)  # the engine's process: frozen
        try:
            started = time.monotonic()
            frozen = [client.post(p, content=b, headers={"Content-Type": "application/json"},
                                  timeout=10) for p, b, _, _ in MALFORMED]
            over = client.post("/v1/completions", content=b"x" * (5 * 2**20),
                               headers={"Content-Type": "application/json"}, timeout=10)
            seconds = time.monotonic() - started
        finally:
            os.kill(server_pid(edged), signal.SIGCONT)
    for (path, _, status, param), a, b in zip(MALFORMED, direct, frozen, strict=True):
        assert b.status_code == status, (path, b.text)
        assert b.json() == a.json(), path  # the edge's refusal reads as the server's
        if param is not None:
            assert b.json()["error"]["param"] == param, (path, b.text)
    assert over.status_code == 413 and over.json()["error"]["param"] == "max_body_bytes"
    assert seconds < 10


def test_valid_requests_stream_through_and_count_from_the_edge(edged):
    body = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.Client(base_url=edged.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            events = sse_events(list(reply.iter_lines()))
        plain = client.post("/v1/completions", json={**body, "stream": False}).json()
        over_range = client.post("/v1/completions", json={**body, "stop_token_ids": [-1]})
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text == plain["choices"][0]["text"]
    # a check that needs the model is the server's: its answer passes the edge unchanged
    assert over_range.status_code == 400
    assert over_range.json()["error"]["param"] == "stop_token_ids"


def test_a_client_that_leaves_frees_its_request_at_the_server(edged):
    body = {"prompt": "Hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=edged.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as reply:
            next(reply.iter_lines())  # the first chunk: running
        deadline = time.monotonic() + 20
        while True:
            engine = client.get("/readyz").json()["engine"]
            if engine["running"] == 0 and engine["waiting"] == 0:
                break
            assert time.monotonic() < deadline, engine
            time.sleep(0.05)


def test_the_edge_stamps_arrival_and_only_an_edged_server_trusts_it():
    seen = {}

    async def app(scope, receive, send):
        seen["stamp"] = scope["state"][ARRIVAL_KEY]

    def stamp(behind_edge: bool, value: bytes) -> float:
        scope = {"type": "http", "headers": [(EDGE_ELAPSED_HEADER.encode(), value)]}
        before = time.perf_counter()
        import asyncio

        asyncio.run(StampArrival(app, behind_edge=behind_edge)(scope, None, None))
        return before - seen["stamp"]

    assert 1.9 < stamp(True, b"2.0") < 2.5  # moved back by the edge's 2 s
    assert stamp(False, b"2.0") < 0.5  # a server without an edge ignores the header
    for garbled in (b"nan", b"-5", b"x", b"\xff"):
        assert stamp(True, garbled) < 0.5, garbled
    assert stamp(True, b"1e300") < 3601  # capped


def test_the_edge_forwards_the_query_and_only_its_own_elapsed_header(monkeypatch):
    """What the server receives from the edge (its Unix socket stood in for): the path with
    its query, the client's headers less hop-by-hop ones, and one EDGE_ELAPSED_HEADER, the
    edge's own (a client's copy would move its arrival back by whatever it claims)."""
    import asyncio

    from control.api.limits import RequestLimits
    from control.edge import app as edge_app
    from control.edge.forward import Upstream

    seen: list[httpx.Request] = []

    async def body():
        yield b'{"ok": true}'

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=body(), headers={
            "content-type": "application/json", "connection": "close", "x-served": "yes"})

    class StandIn(Upstream):
        def __init__(self, uds: str):
            self.client = httpx.AsyncClient(transport=httpx.MockTransport(server),
                                            base_url="http://batchpilot")

    async def go() -> httpx.Response:
        app = edge_app.create_edge_app("/nonexistent.sock", RequestLimits())
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://edge") as client:
            return await client.get("/v1/trace/slow?limit=3&by=ttft_s", headers={
                EDGE_ELAPSED_HEADER: "3600", "X-Tenant": "acme", "Upgrade": "h2c"})

    monkeypatch.setattr(edge_app, "Upstream", StandIn)
    reply = asyncio.run(go())
    assert reply.status_code == 200 and reply.json() == {"ok": True}
    assert reply.headers["x-served"] == "yes" and "connection" not in reply.headers
    (request,) = seen
    assert request.url.path == "/v1/trace/slow"
    assert dict(request.url.params) == {"limit": "3", "by": "ttft_s"}
    assert request.headers["x-tenant"] == "acme" and "upgrade" not in request.headers
    elapsed = request.headers.get_list(EDGE_ELAPSED_HEADER)
    assert len(elapsed) == 1 and float(elapsed[0]) < 60, elapsed


def test_edge_auto_means_on_exactly_when_the_host_is_not_loopback():
    assert not ServeSettings().behind_edge
    assert ServeSettings(host="0.0.0.0").behind_edge
    assert not ServeSettings(host="0.0.0.0", edge="off").behind_edge
    assert ServeSettings(edge="on").behind_edge
    with pytest.raises(ValueError, match="edge"):
        ServeSettings(edge="maybe").validate()


def test_the_edge_dying_stops_the_server(tiny_llama_dir, tmp_path):
    with ServerProcess(tiny_llama_dir, tmp_path, CONFIG, "--edge", "on") as server:
        os.kill(edge_pid(server), signal.SIGKILL)
        code = server.wait(60)
        log = server.log()
    assert code == 1, log
    assert "the edge process exited" in log


def test_an_edge_that_cannot_bind_fails_the_start(tiny_llama_dir, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    server = ServerProcess(tiny_llama_dir, tmp_path, CONFIG, "--edge", "on")
    server.cmd[server.cmd.index("--port") + 1] = str(port)
    try:
        with pytest.raises(AssertionError, match="server exited"):
            server.__enter__()  # waits for the ready line, which never comes
        assert server.wait(30) == 1
        assert "before it listened" in server.log()
    finally:
        taken.close()


def test_the_edge_refuses_too_many_chat_messages_without_asking_the_server(monkeypatch):
    """max_messages is checked at the edge, for chat completions and chat tokenize alike: a
    request over it never reaches the server (the 400 names `messages`)."""
    import asyncio

    from control.api.limits import RequestLimits
    from control.edge import app as edge_app
    from control.edge.forward import Upstream

    seen: list[str] = []

    async def body():
        yield b'{"ok": true}'

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, content=body(), headers={"content-type": "application/json"})

    class StandIn(Upstream):
        def __init__(self, uds: str):
            self.client = httpx.AsyncClient(transport=httpx.MockTransport(server),
                                            base_url="http://batchpilot")

    messages = [{"role": "user", "content": "hi"}] * 3

    async def go() -> list[httpx.Response]:
        app = edge_app.create_edge_app("/nonexistent.sock", RequestLimits(max_messages=2))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://edge") as client:
            return [await client.post(path, json={"messages": messages, **extra})
                    for path, extra in (("/v1/chat/completions", {}), ("/tokenize", {}),
                                        ("/v1/chat/completions", {"n": 1, "messages":
                                                                  messages[:2]}))]

    monkeypatch.setattr(edge_app, "Upstream", StandIn)
    over_chat, over_tokenize, within = asyncio.run(go())
    for reply in (over_chat, over_tokenize):
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages"
    assert within.status_code == 200 and seen == ["/v1/chat/completions"]


def test_an_edge_that_could_not_listen_exits_non_zero(monkeypatch):
    """The port was taken (uvicorn logged why): the edge exits 1, so the server's wait for
    its ready line reports the failure instead of a clean exit."""
    from control.edge import __main__ as edge_main

    class NeverStarted:
        def __init__(self, config, parent, host):
            self.started = False

        def run(self) -> None:
            """uvicorn gave up before it listened."""

    monkeypatch.setattr(edge_main, "EdgeServer", NeverStarted)
    assert edge_main.main(["--uds", "/tmp/none.sock", "--host", "127.0.0.1", "--port", "1",
                           "--limits", "{}", "--parent", "1"]) == 1
