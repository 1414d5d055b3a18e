"""Helpers for the server tests: engines over the tiny model, clients, servers.

    engine, spy = make_engine(tiny_loaded, delay_s=0.01, max_num_seqs=2)
    async with asgi_client(engine) as client: ...              # httpx over ASGI
    with LiveServer(engine) as url: ...                          # uvicorn in a thread
    with ServerProcess(model_dir, tmp_path, config) as proc: ...  # `batchpilot serve`
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from control.app import create_app
from control.bootstrap import build_parts
from control.engine_loop import AsyncEngine
from control.server import READY_LINE, DrainingServer
from control.settings import ServeSettings
from engine.records import SchedulerOutput

ROOT = Path(__file__).resolve().parents[2]
SMALL_ENGINE = {"num_kv_blocks": 256}  # 4096 tokens: plenty for the tests, cheap to allocate


class SlowExecutor:
    """Wraps the model runner: sleeps delay_s per step (streams last long enough to be
    interrupted) and remembers every request that ever ran."""

    def __init__(self, inner: Any, delay_s: float):
        self.inner, self.delay_s = inner, delay_s
        self.ran: set[str] = set()

    def execute(self, out: SchedulerOutput) -> list[int]:
        self.ran.update(r.request_id for r in out.decodes)
        self.ran.update(c.request.request_id for c in out.prefills)
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner.execute(out)


def make_engine(loaded: Any, *, delay_s: float = 0.0, config: dict | None = None,
                tmp_path: Path | None = None, settings: ServeSettings | None = None,
                **overrides: Any) -> tuple[AsyncEngine, SlowExecutor, ServeSettings]:
    """An AsyncEngine over `loaded` (not started). `config` is a serving YAML as a dict
    (written under tmp_path); `overrides` are engine options over it."""
    config_path = None
    if config is not None:
        assert tmp_path is not None, "a config needs tmp_path"
        config_path = str(write_yaml(tmp_path / "serving.yaml", config))
    settings = (settings or ServeSettings(model="tiny")).replace(
        config_path=config_path, engine_overrides={**SMALL_ENGINE, **overrides})
    spy: list[SlowExecutor] = []

    def build():
        parts = build_parts(settings, loaded=loaded)
        spy.append(SlowExecutor(parts.engine.executor, delay_s))
        parts.engine.executor = spy[0]
        return parts

    engine = AsyncEngine(build, stall_after_s=settings.stall_after_s)
    engine.start()
    engine.loaded.wait(60)
    assert engine.parts is not None, engine.load_error
    return engine, spy[0], settings


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.asynccontextmanager
async def asgi_client(engine: AsyncEngine, settings: ServeSettings, *, stop: bool = True
                      ) -> AsyncIterator[httpx.AsyncClient]:
    """httpx over ASGI. No lifespan runs: the engine is stopped here after (unless `stop`
    is False: a module's shared engine)."""
    app = create_app(settings, engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     timeout=60) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client
    finally:
        if stop:
            engine.stop()


async def wait_until_idle(engine: AsyncEngine, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await engine.call(lambda e: e.has_unfinished_requests()):
        assert time.monotonic() < deadline, "the engine never went idle"
        await asyncio.sleep(0.02)


async def kv_in_use(engine: AsyncEngine) -> int:
    """Blocks held by requests (cached free blocks excluded), after an integrity check."""
    def read(e) -> int:
        e.check_integrity()
        return e.block_manager.num_used
    return await engine.call(read)


class LiveServer:
    """uvicorn in a thread on 127.0.0.1:<free port>, over a given engine; `with` gives the
    URL. Signals are not captured (not the main thread): stop() asks it to exit."""

    def __init__(self, engine: AsyncEngine, settings: ServeSettings):
        self.app = create_app(settings.replace(host="127.0.0.1", port=0), engine)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = DrainingServer(config, self.app.state.serving, announce=False)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.server.bound_url is None:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no server"
            time.sleep(0.02)
        return self.server.bound_url

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class ServerProcess:
    """`python -m control.cli serve` on 127.0.0.1, port 0; waits for the ready line."""

    def __init__(self, model_dir: Path, tmp_path: Path, config: dict, *args: str):
        config_path = write_yaml(tmp_path / "serving.yaml", config)
        self.log_path = tmp_path / "server.log"
        self.cmd = [sys.executable, "-m", "control.cli", "serve", "--model", str(model_dir),
                    "--config", str(config_path), "--host", "127.0.0.1", "--port", "0",
                    "--log-level", "warning", *args]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while not self.url:
            assert self.proc.poll() is None, f"server exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"server not ready:\n{self.log()}"
            for line in self.log().splitlines():
                if line.startswith(READY_LINE):
                    self.url = line.rsplit(" at ", 1)[1].strip()
            time.sleep(0.1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def sse_events(lines: list[str]) -> list[Any]:
    """The `data:` payloads of an SSE body: parsed JSON, or the string "[DONE]"."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
