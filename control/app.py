"""The FastAPI app: OpenAI-compatible routes and probes over one AsyncEngine.

    app = create_app(ServeSettings(model="smollm2-135m"))   # the engine loads on startup

Tests pass their own AsyncEngine (a tiny model, small budgets) and may start it themselves;
`start()` is idempotent. The lifespan starts the engine loop and, at shutdown, ends what is
left and stops the thread.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from control import health, routes
from control.bootstrap import build_parts
from control.engine_loop import AsyncEngine
from control.errors import install_error_handlers
from control.settings import ServeSettings
from control.state import ServerState


def create_app(settings: ServeSettings, engine: AsyncEngine | None = None) -> FastAPI:
    settings.validate()
    if engine is None:
        engine = AsyncEngine(functools.partial(build_parts, settings),
                             stall_after_s=settings.stall_after_s)
    state = ServerState(settings, engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.abort_all("shutdown")
            engine.stop()
            state.close()

    app = FastAPI(title="batchpilot", summary="OpenAI-compatible LLM serving",
                  lifespan=lifespan)
    app.state.serving = state
    install_error_handlers(app)
    app.include_router(routes.router)
    app.include_router(health.router)
    return app
