"""Run the app under uvicorn, with graceful draining on SIGTERM / SIGINT.

    SIGTERM -> draining: new requests get 503 + Retry-After, /readyz 503
            -> in-flight requests get up to shutdown_grace_s to finish
            -> the rest are aborted: streams end with a final chunk (finish_reason
               "cancelled" and an error saying the server is shutting down)
            -> uvicorn stops; the process exits 0
    a second SIGINT (Ctrl+C) while draining forces the exit at once

uvicorn's own handler (`Server.handle_exit`) would stop at once and record the signal, to
raise it again after shutdown (so the process would die by the signal, not exit 0); the
subclass replaces it and records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from types import FrameType

import uvicorn

from control.api.app import create_app
from control.edge.process import EdgeProcess, remove_socket, socket_path
from control.serve.read_deadlines import ReadDeadlines
from control.serve.settings import KEEP_ALIVE_S, ServeSettings
from control.serve.state import ServerState
from engine.gc_heap import freeze_startup_heap
from engine.scheduling.goodput import describe_policy

log = logging.getLogger("batchpilot.server")

POLL_S = 0.05
EDGE_POLL_S = 0.5
FLUSH_S = 5.0  # after the grace period: time for the aborted streams' final chunks
READY_LINE = "batchpilot: ready"


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, *, announce: bool = True,
                 edge_uds: str | None = None, freeze_heap: bool = True):
        super().__init__(config)
        self.state = state
        self.announce = announce
        # once loaded, the process's heap frozen for its life (engine/gc_heap.py); False for
        # a server embedded in a process that outlives it (the tests')
        self.freeze_heap = freeze_heap
        self.edge_uds = edge_uds  # listening there, behind an edge process (control/edge/)
        self.edge: EdgeProcess | None = None
        self.edge_url: str | None = None
        self.exit_code = 0
        self.bound_url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._draining = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            self._loop.add_signal_handler(signal.SIGHUP, self._reload_config)  # main thread
        if self.edge_uds is not None and not self.should_exit:
            await self._start_edge(self.edge_uds)
        if not self.should_exit:
            self._spawn(self._when_ready())

    async def _start_edge(self, uds: str) -> None:
        """The edge process in front, listening where the settings say; its death later
        drains and stops this server (nothing could reach it any more)."""
        settings = self.state.settings
        self.edge = EdgeProcess(uds, settings.host, settings.port, settings.limits,
                                settings.log_level)
        try:
            self.edge_url = await self._loop.run_in_executor(None, self.edge.wait_ready)
        except RuntimeError as exc:
            log.error("%s", exc)
            self.exit_code = 1
            self.should_exit = True
            return
        self._spawn(self._watch_edge())

    async def _watch_edge(self) -> None:
        while self.edge is not None and self.edge.alive():
            await asyncio.sleep(EDGE_POLL_S)
        if not self._draining and self.edge is not None:
            log.error("the edge process exited (%s): draining and stopping",
                      self.edge.proc.returncode)
            self.exit_code = 1
            self.handle_exit(signal.SIGTERM, None)

    def stop_edge(self) -> None:
        if self.edge is not None:
            self.edge.stop()
        elif self.edge_uds is not None:
            remove_socket(self.edge_uds)

    def _reload_config(self) -> None:
        """SIGHUP: reload the --config YAML now (validated, versioned, audited)."""
        watcher = self.state.config_watcher
        if watcher is None:
            log.warning("SIGHUP: no --config file is watched; nothing to reload")
        else:
            log.info("SIGHUP: reloading %s", watcher.path)
            watcher.trigger()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None:  # not serving yet: nothing to drain
            self.should_exit = True
        elif self._draining:
            if sig == signal.SIGINT:
                log.warning("second interrupt: exiting without waiting")
                self.should_exit = self.force_exit = True
        else:
            self._draining = True
            self._loop.call_soon_threadsafe(self._spawn, self.drain())

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Stop admitting, let in-flight requests finish within the grace period, abort the
        rest, then let uvicorn exit."""
        state, engine = self.state, self.state.engine
        grace_s = state.settings.shutdown_grace_s
        engine.start_draining()
        log.info("draining: new requests get 503; %d in flight get up to %.1fs",
                 state.inflight, grace_s)
        await _wait_idle(state, grace_s)
        if state.inflight:
            log.warning("grace period over: ending %d requests", state.inflight)
            engine.abort_all("shutdown")
            await _wait_idle(state, FLUSH_S)
        self.should_exit = True

    async def _when_ready(self) -> None:
        try:
            await self.state.engine.wait_loaded()
        except RuntimeError as exc:
            log.error("%s", exc)
            self.exit_code = 1
            self.should_exit = True
            return
        self.bound_url = self._bound_url()
        if self.freeze_heap:
            freeze_startup_heap()
        if self.announce:
            parts = self.state.engine.parts
            fit = getattr(parts, "step_fit", None)
            notes = [getattr(parts, "weights", ""), fit.summary() if fit is not None else "",
                     describe_policy(self.state.engine.live_config, fit is not None,
                                     parts.static.target_step_ms)]
            governor = parts.engine.thread_governor
            if governor is not None:
                notes.append(f"threads: {governor.all_threads} for the steps, one while"
                             " another process holds a core (engine/calibration/"
                             "thread_governor.py)")
            if self.state.settings.otlp is not None:
                notes.append(self.state.settings.otlp.describe())
            if self.edge is not None:
                notes.append(f"edge: bodies validated in their own process (pid"
                             f" {self.edge.proc.pid}) before they reach the engine's")
            print(banner(self.bound_url, self.state.settings.model_name,
                         "\n  ".join(n for n in notes if n) or None), flush=True)

    def _bound_url(self) -> str:
        if self.edge_url is not None:
            return self.edge_url
        settings = self.state.settings
        port = settings.port
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                port = sock.getsockname()[1]
        return settings.replace(port=port).url


async def _wait_idle(state: ServerState, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while state.inflight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)

def banner(url: str, model: str, budgets: str | None = None) -> str:
    """The ready line and how to try it; `budgets`: the lines saying what the weights run
    in and which step budgets were fitted to the device (engine/calibration/budget_fit.py),
    if any."""
    body = json.dumps({"model": model, "max_tokens": 32,
                       "messages": [{"role": "user", "content": "What is a KV cache?"}]})
    return (f"{READY_LINE}: serving {model} at {url}\n"
            f"  try:  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'"
            f" -d '{body}'\n"
            f"  probes: {url}/healthz {url}/readyz   stop: Ctrl+C or SIGTERM (drains first)"
            + (f"\n  {budgets}" if budgets else ""))


def serve(settings: ServeSettings) -> int:
    """Run until drained; the process's exit code (0 after a graceful shutdown)."""
    app = create_app(settings)
    uds = socket_path() if settings.behind_edge else None
    where = {"uds": uds} if uds else {"host": settings.host, "port": settings.port}
    config = uvicorn.Config(app, **where, log_level=settings.log_level, lifespan="on",
                            timeout_graceful_shutdown=int(FLUSH_S),
                            timeout_keep_alive=KEEP_ALIVE_S, http=ReadDeadlines)
    server = DrainingServer(config, app.state.serving, edge_uds=uds)
    try:
        server.run()
    finally:
        server.stop_edge()
    if not server.started and server.exit_code == 0:
        return 1  # e.g. the port was taken (uvicorn logged why)
    sys.stdout.flush()
    return server.exit_code
