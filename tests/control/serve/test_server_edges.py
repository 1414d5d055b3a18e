"""Edges of the server's start-up and drain (control/serve/server.py), on a DrainingServer
over a stand-in engine (no model, no process): signals before serving, during a drain and
twice; the grace period in seconds; the address the ready line gives; a failed load, a dead
edge and the edge's socket."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from types import SimpleNamespace

import uvicorn

from control.serve import server as server_module
from control.serve.server import DrainingServer
from control.serve.settings import ServeSettings


class FakeEngine:
    """What drain() and _when_ready() call; `abort_all` ends every request in flight."""

    def __init__(self, state: SimpleNamespace):
        self.state, self.calls = state, []

    def start_draining(self) -> None:
        self.calls.append("start_draining")

    def abort_all(self, why: str) -> None:
        self.calls.append(f"abort_all:{why}")
        self.state.inflight = 0

    async def wait_loaded(self) -> None:
        raise RuntimeError("the model did not load")


def draining_server(grace_s: float = 5.0, inflight: int = 0) -> DrainingServer:
    settings = ServeSettings(model="tiny", host="127.0.0.1", port=0,
                             shutdown_grace_s=grace_s)
    state = SimpleNamespace(settings=settings, inflight=inflight, config_watcher=None)
    state.engine = FakeEngine(state)

    async def app(scope, receive, send):  # never served: the tests call its parts
        raise AssertionError("no request expected")

    return DrainingServer(uvicorn.Config(app), state, announce=False, freeze_heap=False)


def finish_after(state: SimpleNamespace, delay_s: float) -> None:
    asyncio.get_running_loop().call_later(delay_s, setattr, state, "inflight", 0)


def test_a_signal_before_serving_just_stops():
    server = draining_server()
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not server.force_exit and not server._tasks


def test_one_drain_however_many_sigterms_and_a_second_ctrl_c_forces_the_exit():
    async def go(server):
        server._loop = asyncio.get_running_loop()
        server.handle_exit(signal.SIGTERM, None)
        server.handle_exit(signal.SIGTERM, None)  # an orchestrator repeating itself
        await asyncio.sleep(0.05)
        assert server.state.engine.calls == ["start_draining"]
        assert not server.should_exit and not server.force_exit  # still within the grace
        server.handle_exit(signal.SIGINT, None)
        assert server.should_exit and server.force_exit
        for task in list(server._tasks):
            task.cancel()
    asyncio.run(go(draining_server(grace_s=5.0, inflight=1)))


def test_a_request_finishing_within_the_grace_period_is_not_aborted():
    async def go(server):
        finish_after(server.state, 0.2)
        start = time.monotonic()
        await server.drain()
        assert 0.15 < time.monotonic() - start < 2.0
    server = draining_server(grace_s=3.0, inflight=1)
    asyncio.run(go(server))
    assert server.state.engine.calls == ["start_draining"] and server.should_exit


def test_an_idle_server_drains_at_once_and_one_past_the_grace_is_aborted():
    server = draining_server(grace_s=3.0)
    start = time.monotonic()
    asyncio.run(server.drain())
    assert time.monotonic() - start < 1.0 and server.should_exit  # not the whole grace
    late = draining_server(grace_s=0.1, inflight=2)
    start = time.monotonic()
    asyncio.run(late.drain())
    assert late.state.engine.calls == ["start_draining", "abort_all:shutdown"]
    assert late.should_exit and time.monotonic() - start < 1.0


def test_the_ready_address_is_the_bound_port_or_the_edges():
    server = draining_server()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server.servers = [SimpleNamespace(sockets=[sock])]
        assert server._bound_url() == f"http://127.0.0.1:{port}"
    server.edge_url = "http://127.0.0.1:9"
    assert server._bound_url() == "http://127.0.0.1:9"


def test_a_model_that_fails_to_load_exits_one():
    server = draining_server()
    asyncio.run(server._when_ready())
    assert server.exit_code == 1 and server.should_exit and server.bound_url is None


def test_a_dead_edge_stops_the_server_with_one_unless_it_is_draining(monkeypatch):
    monkeypatch.setattr(server_module, "EDGE_POLL_S", 0.01)
    dead = SimpleNamespace(alive=lambda: False, proc=SimpleNamespace(returncode=3))

    async def watch(server):
        server._loop, server.edge = asyncio.get_running_loop(), dead
        await server._watch_edge()
        await asyncio.sleep(0.05)  # the drain it started
    died = draining_server()
    asyncio.run(watch(died))
    assert died.exit_code == 1 and died.should_exit
    stopping = draining_server()
    stopping._draining = True  # a SIGTERM's drain stopped the edge first
    asyncio.run(watch(stopping))
    assert stopping.exit_code == 0


def test_a_server_without_its_edge_removes_the_edges_socket(tmp_path):
    uds = tmp_path / "edge.sock"
    uds.write_text("")
    server = draining_server()
    server.edge_uds = str(uds)
    server.stop_edge()
    assert not uds.exists()
