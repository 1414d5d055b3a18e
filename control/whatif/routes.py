"""`POST /v1/whatif`: predict live config changes from the server's own trace. Read-only.

    POST /v1/whatif {"since": "-1h", "until": null,
                     "set": {"max_num_seqs": 64}            # one proposal, "proposed"
                     "compare": {"seqs4": {"max_num_seqs": 4}, ...},   # and/or named ones
                     "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 10},
                     "rate_scale": 2,                 # the proposals at twice the rate
                     "rate_sweep": [1, 1.5, 2, 3],    # every config at each: "capacity"
                     "replicas": 3}                   # each on 3 replicas behind a router

The answer is control/whatif/compare.py's result. The window is read on a worker thread
(the trace writer's cursor); the calibration and replays run in a separate process (one
at a time, `spawn`ed on first use), so a long prediction holds neither the event loop nor
the GIL the engine thread needs. The recorded config is the server's own: its static
config, and the live config of the version in force at the window's start while the
control API's history still holds it (else the current one, said in the notes).
Each proposal that changes something is recorded in the trace's `config_changes` as a
`whatif` row (control/whatif/audit.py): the audit shows what was predicted before a change.
Errors: 400 naming the field (a bad body, time, setting: the control API's validation and
wording), 404 tracing off, 503 still loading; 400/429 naming the limit past
max_whatif_proposals, max_whatif_window_s or max_whatif_waiting (control/whatif/bounds.py).

Who may predict: a read token whenever the server has tokens (401 without, before the body
is looked at). A token bound to tenants gets 403: a what-if replays every tenant's requests
together, since they share the engine. Replaying its tenants' requests alone would predict
a server without the others' load (wrong, and flattering); replaying all of them would show
it every tenant's outcomes (`by_tenant`, the totals) and record the prediction in the
config audit it may not read. An unbound read token runs it for them.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from control.admin.auth import require_unbound
from control.api.errors import APIError
from control.api.limits import RequestLimits
from control.loadtest.records import SLO
from control.serve.state import ServerState, get_state
from control.trace.routes import Reader
from control.trace.timeparse import parse_time
from control.whatif import bounds
from control.whatif.audit import record_predictions
from control.whatif.capacity import check_rate, check_replicas, check_sweep
from control.whatif.configs import propose, recorded_config
from control.whatif.run import predict
from control.whatif.window import Window, read_window
from engine.config import EngineConfig
from engine.config.known_keys import did_you_mean
from engine.config.patch import diff

router = APIRouter()
BODY_KEYS = {"since", "until", "set", "compare", "slo", "rate_scale", "rate_sweep",
             "replicas"}
SYNC_TIMEOUT_S = 2.0
_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
waiting = bounds.Waiting()  # predictions admitted and not done, with the one process


def _predictor() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1,
                                        mp_context=multiprocessing.get_context("spawn"))
        return _pool


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def parse_body(body: Any) -> tuple[dict[str, dict], SLO | None, float | None, float | None]:
    """-> (proposals, slo, since, until); APIError 400 naming the field."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body")
    for key in body:
        if key not in BODY_KEYS:
            raise _bad(f"unknown field {key!r}{did_you_mean([str(key)], BODY_KEYS)}; fields:"
                       f" {', '.join(sorted(BODY_KEYS))}", key)
    props: dict[str, dict] = {}
    if body.get("set") is not None:
        if not isinstance(body["set"], dict) or not body["set"]:
            raise _bad("set must be a non-empty object of settings", "set")
        props["proposed"] = body["set"]
    compare = body.get("compare") or {}
    if not isinstance(compare, dict):
        raise _bad("compare must be an object {name: {settings}}", "compare")
    for name, patch in compare.items():
        if not isinstance(patch, dict) or not patch:
            raise _bad(f"compare.{name} must be a non-empty object of settings",
                       f"compare.{name}")
        props[name] = patch
    if not props:
        raise _bad("nothing to predict: give set {...} or compare {name: {...}}", "set")
    slo = body.get("slo")
    if slo is not None:
        if not isinstance(slo, dict) or set(slo) - {"ttft_s", "tpot_s", "e2e_s"}:
            raise _bad("slo must be an object of ttft_s, tpot_s, e2e_s (seconds)", "slo")
        for key, value in slo.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise _bad(f"slo.{key}={value!r} must be a number of seconds > 0",
                           f"slo.{key}")
        slo = SLO(**slo)
    times = []
    for key in ("since", "until"):
        try:
            times.append(parse_time(body.get(key)))
        except (ValueError, TypeError) as exc:
            raise _bad(f"{key}: {exc}", key) from None
    return props, slo, times[0], times[1]


def _read(state: ServerState, since: float | None, until: float | None) -> Window:
    writer = state.trace
    assert writer is not None
    writer.sync(SYNC_TIMEOUT_S)
    con = writer.cursor()
    try:
        bounds.check_span(con, since, until, state.settings.limits)
        return read_window(con, since, until)
    except ValueError as exc:
        raise _bad(str(exc), "since") from None
    finally:
        con.close()


def _base(state: ServerState, window: Window) -> tuple[EngineConfig, list[str]]:
    """The server's config at the window's version, when the history still holds it."""
    parts = state.engine.parts
    assert parts is not None
    version = window.facts.config_version
    history = state.config_store.history if state.config_store is not None else []
    live = next((v.live for v in history if v.version == version), None)
    current = state.engine.live_config
    if live is not None:
        moved = sorted(diff(live, current))
        return EngineConfig(parts.static, live), [
            f"the config changed since the window began (version {version} -> "
            f"{current.version}: {', '.join(moved)}): proposals replay onto the window's,"
            " and are recorded as changes of the live one (control/whatif/audit.py)"
        ] if moved else []
    if current.version == version:  # no change since (the history starts on first use)
        return EngineConfig(parts.static, current), []
    return EngineConfig(parts.static, current), [
        f"config version {version} (the window's) is no longer in the server's history:"
        f" replayed under the current version {current.version}"]


@router.post("/v1/whatif")
async def whatif(request: Request, who: Reader, body: dict[str, Any]) -> Any:
    require_unbound(who, "a what-if (it replays every tenant's requests together)")
    state = get_state(request)
    limits: RequestLimits = state.settings.limits
    props, slo, since, until = parse_body(body)
    parse_rates(body)  # a bad rate is a 400 before the trace is read
    bounds.check_proposals(props, limits, "compare" if body.get("compare") else "set")
    bounds.check_window(since, until, limits)
    if state.trace is None:
        raise APIError(404, "tracing is off: start the server with --trace-db PATH",
                       code="trace_off")
    if state.engine.parts is None:
        raise APIError(503, "the model is loading", code="loading")
    waiting.admit(limits)  # held until the job is done: released below or by its future
    try:
        job = await _prepare(state, body, props, slo, since, until)
        future = _predictor().submit(job)
    except BrokenProcessPool as exc:
        waiting.release()
        raise _died(exc) from exc
    except BaseException:
        waiting.release()
        raise
    waiting.release_when(future)
    try:
        result = await asyncio.wrap_future(future)
    except BrokenProcessPool as exc:
        raise _died(exc) from exc
    live = EngineConfig(state.engine.parts.static, state.engine.live_config)
    record_predictions(state.trace, live, who.name, result)
    return result


def _died(exc: BrokenProcessPool) -> APIError:
    global _pool
    with _pool_lock:
        _pool = None  # start a fresh one next time
    return APIError(500, f"the what-if process died ({exc}); try again", code="whatif_failed")


def parse_rates(body: dict[str, Any]) -> dict[str, Any]:
    """rate_scale, rate_sweep and replicas as predict takes them; APIError 400 naming the
    field."""
    out: dict[str, Any] = {}
    for key, check in (("rate_scale", check_rate), ("rate_sweep", check_sweep),
                       ("replicas", check_replicas)):
        if body.get(key) is not None:
            try:
                out[key] = check(body[key], key)
            except ValueError as exc:
                raise _bad(str(exc), key) from None
    return out


async def _prepare(state: ServerState, body: dict[str, Any], props: dict[str, dict],
                   slo: SLO | None, since: float | None, until: float | None,
                   ) -> functools.partial:
    """The window, read on a worker thread, and the job for the predictor process; each
    proposal validated as the control API would, before any replay."""
    window = await run_in_threadpool(_read, state, since, until)
    base, notes = _base(state, window)
    recorded, _ = recorded_config(window, base, exact=True)
    for name, patch in props.items():
        try:
            propose(recorded, patch)
        except ValueError as exc:
            raise _bad(f"{name}: {exc}", f"compare.{name}" if name in (
                body.get("compare") or {}) else "set") from None
    return functools.partial(predict, window, base, props, exact=True, slo=slo, notes=notes,
                             **parse_rates(body))
