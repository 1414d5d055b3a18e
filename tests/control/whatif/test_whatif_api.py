"""`POST /v1/whatif` on the real route: the server's trace (held by its writer), its own
config, the prediction in a separate process; bad bodies are 400 naming the field."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from whatif_sim_trace import START, STATIC, record

from control.api.errors import install_error_handlers
from control.api.limits import RequestLimits
from control.trace.writer import TraceSettings, TraceWriter
from control.whatif import routes as whatif_routes
from engine.config import LiveConfig

LIVE = LiveConfig(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=128,
                  version=1)


def _app(writer: TraceWriter | None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(whatif_routes.router)
    engine = SimpleNamespace(parts=SimpleNamespace(static=STATIC), live_config=LIVE)
    app.state.serving = SimpleNamespace(trace=writer, engine=engine, config_store=None,
                                        control_tokens=(),
                                        settings=SimpleNamespace(limits=RequestLimits()))
    return app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("served") / "trace.duckdb")
    record(path, LIVE, n=60)
    writer = TraceWriter(TraceSettings(path), "run2", "sim").start()  # the server holds it
    yield _app(writer)
    writer.stop()


def _post(app: FastAPI, body: object) -> httpx.Response:
    """`body` as JSON; bytes as they are (JSON that json.dumps would not write: 1e400)."""
    sent = {"content": body, "headers": {"Content-Type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=120) as client:
            return await client.post("/v1/whatif", **sent)

    return asyncio.run(go())


def test_a_prediction_over_the_servers_own_trace(app):
    resp = _post(app, {"since": START, "set": {"max_num_seqs": 2},
                       "compare": {"wide": {"max_num_batched_tokens": 512}},
                       "slo": {"ttft_s": 0.2}})
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert result["columns"] == ["recorded", "predicted", "proposed", "wide"]
    assert result["window"]["requests"] == 60 and result["window"]["run_id"] == "run1"
    assert result["configs"]["proposed"]["diff"] == {"max_num_seqs": [8, 2]}
    assert result["slo"] == {"ttft_s": 0.2, "tpot_s": None, "e2e_s": None}
    assert result["summaries"]["predicted"]["goodput_rps"] is not None
    # the server's config is exact: nothing is said to be assumed from defaults
    assert not any("built-in defaults" in n for n in result["notes"])


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"set": {"max_num_seqs": 0}}, "set", "max_num_seqs=0 must be in 1..8192"),
    ({"compare": {"x": {"no_such_knob": 1}}}, "compare.x", "no_such_knob"),
    ({"set": {"block_size": 32}}, "set", "static setting"),
    ({"set": {"max_num_seqs": 4}, "sine": "-1h"}, "sine",
     "unknown field 'sine' (did you mean since?)"),
    ({}, "set", "nothing to predict"),
    ({"compare": {"x": {}}}, "compare.x", "non-empty object"),
    ({"set": {"max_num_seqs": 4}, "since": "2100-01-01T00:00"}, "since", "no request arrived"),
    ({"set": {"max_num_seqs": 4}, "until": "soonish"}, "until", "is not understood"),
    # a JSON number out of range parses as inf: a window bounded by it would hold nothing
    (b'{"set": {"max_num_seqs": 4}, "since": 1e400}', "since", "not a finite number"),
    ({"set": {"max_num_seqs": 4}, "slo": {"ttft_s": -1}}, "slo.ttft_s", "must be a number"),
    ({"set": {"max_num_seqs": 4}, "slo": {"e2e_s": 0}}, "slo.e2e_s", "must be a number"),
])
def test_bad_input_is_400_naming_the_field(app, body, param, needle):
    resp = _post(app, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and needle in error["message"]


def test_tracing_off_is_404():
    resp = _post(_app(None), {"set": {"max_num_seqs": 4}})
    assert resp.status_code == 404 and "--trace-db" in resp.json()["error"]["message"]


def test_a_window_version_gone_from_the_history_is_said_in_the_notes(app):
    """The window's config version is the current one: replayed under it, nothing said.
    Moved on, with no history holding the window's: replayed under the current one, and
    the notes say so."""
    gone = "is no longer in the server's history"
    resp = _post(app, {"since": START, "set": {"max_num_seqs": 2}})
    assert resp.status_code == 200, resp.text
    assert not any(gone in n for n in resp.json()["notes"]), resp.json()["notes"]
    engine = app.state.serving.engine
    engine.live_config = LIVE.replace(version=LIVE.version + 2)
    try:
        resp = _post(app, {"since": START, "set": {"max_num_seqs": 2}})
    finally:
        engine.live_config = LIVE
    assert resp.status_code == 200, resp.text
    assert any(f"config version {LIVE.version} (the window's) {gone}" in n
               and f"current version {LIVE.version + 2}" in n
               for n in resp.json()["notes"]), resp.json()["notes"]
