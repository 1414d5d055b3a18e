"""The FastAPI app: OpenAI-compatible routes, probes, /metrics and the trace read API,
over one AsyncEngine.

    app = create_app(ServeSettings(model="smollm2-135m"))   # the engine loads on startup

Tests pass their own AsyncEngine (a tiny model, small budgets) and may start it themselves;
`start()` is idempotent. The lifespan starts the trace writer and the engine loop; at
shutdown it ends what is left, stops the engine thread, then lets the writer commit the
last records and close the database.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from control.admin import routes as admin_routes
from control.admin.auth import check_exposure, load_tokens
from control.admin.config_store import ConfigStore
from control.admin.config_watch import ConfigWatcher
from control.admin.origin_guard import OriginGuard
from control.api import routes as api_routes
from control.api import vllm_routes
from control.api.arrival import StampArrival
from control.api.body_limit import BodyLimit
from control.api.delivery import DeliveryProbe
from control.api.errors import install_error_handlers
from control.api.text_check import UnicodeBody
from control.metrics.gateway import install_gateway_metrics
from control.metrics.gc_pauses import GcPauses
from control.metrics.observer import Observer
from control.metrics.registry import ServingMetrics
from control.otel.settings import keep
from control.serve.bootstrap import build_parts
from control.serve.engine_loop import AsyncEngine
from control.serve.settings import LOOPBACK_HOSTS, ServeSettings
from control.serve.state import ServerState
from control.trace import export_route
from control.trace import routes as trace_routes
from control.trace.writer import TraceSettings, TraceWriter
from control.whatif import routes as whatif_routes


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def open_trace(settings: ServeSettings, run_id: str) -> TraceWriter | None:
    """Open the trace database now (raises ValueError if it cannot be used: e.g. another
    process holds it); None when tracing is off."""
    if not settings.trace_db:
        return None
    trace_settings = TraceSettings(settings.trace_db, max_queue=settings.trace_queue,
                                   kv_snapshot_every=settings.kv_snapshot_every,
                                   retention=settings.trace_retention)
    run_settings = {"model": settings.model, "config": settings.config_path,
                    "engine_overrides": settings.engine_overrides,
                    "device": device_label(settings.device)}
    return TraceWriter(trace_settings, run_id, settings.model_name, run_settings).open()


async def note_loaded(engine: AsyncEngine, writer: TraceWriter | None,
                      store: ConfigStore | None) -> None:
    """Once the model loaded: the step law and the budgets fitted at start-up into the run's
    settings, so a what-if replay of this trace holds its steps to the target and its chunks
    to the fitted size as this server did (neither is in the YAML); and the
    starting config as version 1 of the history (and the trace), stamped now, not when
    someone first asks for it (a startup row in the middle of the traffic, once)."""
    try:
        parts = await engine.wait_loaded()
    except RuntimeError:
        return  # the load failed: nothing was fitted, nothing serves
    fit = getattr(parts, "step_fit", None)
    if fit is not None and writer is not None:
        writer.note_run(step_law=fit.law.to_dict(), target_step_ms=fit.target_step_ms,
                        fitted_budgets=dict(fit.fitted))
    if store is not None:
        store.current()


def device_label(device: str | None) -> str:
    """What the steps run on, for the trace's run settings: step times (and the what-if
    law fitted to them) belong to one device. "cpu (N cores)" or the GPU's name."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"{device} ({os.cpu_count()} cores)"


def exemplar_rule(settings: ServeSettings, feed: Any) -> dict:
    """With an OTLP export, a latency exemplar names a trace only when its spans are
    exported (the feed's own sampling rule), and /metrics shows it once the collector took
    them (`feed`'s delivered traces: never while the collector is down); without,
    ServingMetrics' default."""
    if settings.otlp is None or feed is None:
        return {}
    return {"exemplar_filter": functools.partial(keep, settings=settings.otlp),
            "exemplar_shown": feed.delivered}


def span_feed(settings: ServeSettings):
    """The OpenTelemetry feed when the settings name a collector, else None."""
    if settings.otlp is None:
        return None
    from control.otel.feed import OtelFeed  # the SDK: only for a server that exports

    return OtelFeed(settings.otlp).start()  # the span process imports while the model loads


def create_app(settings: ServeSettings, engine: AsyncEngine | None = None) -> FastAPI:
    settings.validate()
    # tokens guard the trace, what-if and load-test routes too: loaded whatever is on, and
    # checked before anything opens (a refused start leaves no trace file or exporter open)
    tokens = load_tokens(settings.control_tokens_path)
    check_exposure(settings.host, tokens, LOOPBACK_HOSTS, control_api=settings.control_api,
                   trace=bool(settings.trace_db))
    feed = span_feed(settings)
    metrics = ServingMetrics(settings.model_name, settings.metrics_tenants,
                             **exemplar_rule(settings, feed))
    writer = open_trace(settings, new_run_id())
    observer = Observer(metrics, writer, settings.kv_snapshot_every, spans=feed)
    if engine is None:
        engine = AsyncEngine(functools.partial(build_parts, settings),
                             stall_after_s=settings.stall_after_s, observer=observer)
    elif engine.observer is None:
        if engine.parts is not None and engine.live_config is not None:  # loaded already
            observer.prime(engine.live_config, engine.parts.static)
        engine.observer = observer
    install_gateway_metrics(metrics, lambda: engine.parts.static if engine.parts else None,
                            settings.metrics_compat)
    gc_pauses = GcPauses(settings.model_name)  # timed from start-up to shutdown
    metrics.add_source(gc_pauses.families)
    state = ServerState(settings, engine, metrics=metrics, observer=engine.observer,
                        trace=writer, delivery=DeliveryProbe(metrics.registry,
                                                             settings.model_name))
    state.control_tokens = tokens
    if settings.control_api:
        state.config_store = ConfigStore(engine, writer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if writer is not None:
            writer.start()
        gc_pauses.start()
        engine.start()
        loop_lag = asyncio.ensure_future(state.delivery.watch_event_loop())
        noted = asyncio.ensure_future(note_loaded(engine, writer, state.config_store))
        watch = None
        if state.config_store is not None and settings.config_path:  # SIGHUP reloads it
            state.config_watcher = ConfigWatcher(state.config_store, settings.config_path)
            if settings.watch_config:  # and so does an edit
                watch = asyncio.ensure_future(state.config_watcher.run())
        try:
            yield
        finally:
            loop_lag.cancel()
            noted.cancel()
            if watch is not None:
                watch.cancel()
            engine.abort_all("shutdown")
            engine.stop()
            state.close()
            if state.observer is not None:
                state.observer.stop()
            if writer is not None:
                writer.stop()
            gc_pauses.stop()

    app = FastAPI(title="batchpilot", summary="OpenAI-compatible LLM serving",
                  lifespan=lifespan)
    app.state.serving = state
    app.add_middleware(UnicodeBody)  # inside BodyLimit: reads a body already bounded
    # arrival: before the body is read, or at the edge when behind one (control/api/arrival.py)
    app.add_middleware(StampArrival, behind_edge=settings.behind_edge)
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(OriginGuard, check_host=not state.control_tokens
                       and settings.host in LOOPBACK_HOSTS, tokens=state.control_tokens)
    install_error_handlers(app)  # outermost: anything unexpected in the above is a 500
    app.include_router(api_routes.router)
    app.include_router(vllm_routes.router)  # /health, /version, /tokenize, /detokenize
    app.include_router(trace_routes.router)
    app.include_router(export_route.router)  # a fleet ingress pulls rows (docs/fleet.md)
    app.include_router(admin_routes.router)
    app.include_router(whatif_routes.router)  # POST /v1/whatif (docs/whatif.md)
    return app
