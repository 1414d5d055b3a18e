"""`POST /v1/whatif` is bounded (control/whatif/bounds.py): the proposals in one body, the
window's length (given, or measured on the trace when an end is open) and the predictions
waiting for the one predictor process; each refusal names its limit. The trace is the
simulated workload of fixtures/trace_data (about a second of steps, 8 requests)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from fixtures.trace_data import fill_trace

from control.api.errors import install_error_handlers
from control.api.limits import RequestLimits
from control.whatif import routes as whatif_routes
from engine.config import LiveConfig, StaticConfig

STATIC = StaticConfig(num_kv_blocks=40, block_size=16, max_model_len=1024)  # fill_trace's
LIVE = LiveConfig(max_num_seqs=3, max_num_batched_tokens=64, prefill_chunk_size=64,
                  version=2)
DAY = 24 * 3600.0


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    trace = fill_trace(str(tmp_path_factory.mktemp("whatif-limits") / "trace.duckdb"))
    yield trace
    trace.stop()


def app_with(writer, **limits) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(whatif_routes.router)
    engine = SimpleNamespace(parts=SimpleNamespace(static=STATIC), live_config=LIVE)
    app.state.serving = SimpleNamespace(
        trace=writer, engine=engine, config_store=None, control_tokens=(),
        settings=SimpleNamespace(limits=RequestLimits(**limits).validate()))
    return app


def post(app: FastAPI, *bodies: dict) -> list[httpx.Response]:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=120) as client:
            return [await client.post("/v1/whatif", json=body) for body in bodies]

    return asyncio.run(go())


def refused(reply: httpx.Response, status: int, limit: str, param: str | None = None):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert limit in error["message"], error
    if param is not None:
        assert error["param"] == param, error


def test_more_proposals_than_the_limit_is_a_400_naming_it(writer):
    nine = {f"p{i}": {"max_num_seqs": i + 1} for i in range(9)}
    refused(*post(app_with(writer), {"compare": nine}), 400, "max_whatif_proposals=8",
            "compare")
    two = app_with(writer, max_whatif_proposals=2)
    refused(*post(two, {"set": {"max_num_seqs": 2}, "compare": {"a": {"max_num_seqs": 3},
                                                                 "b": {"max_num_seqs": 4}}}),
            400, "max_whatif_proposals=2")


def test_a_window_longer_than_the_limit_is_a_400_naming_it(writer):
    week, short = app_with(writer), app_with(writer, max_whatif_window_s=0.2)
    given = {"set": {"max_num_seqs": 2}, "since": 1_000_000.0, "until": 1_000_000.0 + 8 * DAY}
    refused(*post(week, given), 400, "max_whatif_window_s", "since")
    # an open end reaches the first or last request: the trace's own span is measured
    for body in ({"set": {"max_num_seqs": 2}}, {"set": {"max_num_seqs": 2}, "since": 0},
                 {"set": {"max_num_seqs": 2}, "until": 2_000_000.0}):
        reply, = post(short, body)
        refused(reply, 400, "max_whatif_window_s=0.2 s")
        assert "give both ends" in reply.json()["error"]["message"]
    # the CLI's default (since/until unset: the whole trace) within the limit is predicted
    reply, = post(app_with(writer, max_whatif_window_s=3600.0), {"set": {"max_num_seqs": 2}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["window"]["requests"] > 0


@pytest.mark.timeout(120)
def test_waiting_predictions_past_the_limit_are_a_429_until_one_is_done(writer, monkeypatch):
    release, calls = threading.Event(), []

    def blocked(*args, **kwargs):  # the predictor's job, held until released
        calls.append(1)
        assert release.wait(10), "never released"
        return {"configs": {}}

    pool = ThreadPoolExecutor(1)  # stands in for the one predictor process
    monkeypatch.setattr(whatif_routes, "predict", blocked)
    monkeypatch.setattr(whatif_routes, "_predictor", lambda: pool)
    app, body = app_with(writer, max_whatif_waiting=1), {"set": {"max_num_seqs": 2}}
    waiting = whatif_routes.waiting

    async def until(check) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=60) as client:
            first = asyncio.ensure_future(client.post("/v1/whatif", json=body))
            await until(lambda: calls)
            second = await client.post("/v1/whatif", json=body)
            first.cancel()  # its client leaves; the job it started runs on
            await asyncio.gather(first, return_exceptions=True)
            third = await client.post("/v1/whatif", json=body)
            held = waiting.count
            release.set()
            await until(lambda: waiting.count == 0)
            fourth = await client.post("/v1/whatif", json=body)
            return second, third, held, fourth

    second, third, held, fourth = asyncio.run(scenario())
    pool.shutdown()
    for reply in (second, third):
        refused(reply, 429, "max_whatif_waiting=1")
        assert reply.headers["Retry-After"] == "5"
    assert held == 1  # the running job kept its place after its client left
    assert fourth.status_code == 200, fourth.text
    assert waiting.count == 0


def test_exactly_the_limits_proposals_and_window_are_taken():
    """The limits are the most allowed, not the first refused."""
    from control.whatif.bounds import check_proposals, check_window

    limits = RequestLimits(max_whatif_proposals=2, max_whatif_window_s=60.0).validate()
    check_proposals({"a": {}, "b": {}}, limits, "compare")
    check_window(1000.0, 1060.0, limits)


def test_a_given_since_before_the_first_request_counts_from_since():
    """since=-30d with until open is 30 days long, however late the first request came."""
    import duckdb

    from control.api.errors import APIError
    from control.whatif.bounds import check_span

    con = duckdb.connect()
    con.execute("CREATE TABLE requests (arrival_time DOUBLE, finished_time DOUBLE)")
    con.execute("INSERT INTO requests VALUES (100000.0, 100001.0), (100002.0, NULL)")
    limits = RequestLimits(max_whatif_window_s=3600.0).validate()
    check_span(con, 100000.0 - 3000.0, None, limits)  # 3002 s: within the hour
    with pytest.raises(APIError) as refused_:
        check_span(con, 100000.0 - 7200.0, None, limits)
    assert refused_.value.status == 400 and "spans 7202.0 s" in str(refused_.value)
    with pytest.raises(APIError):
        check_span(con, None, 100000.0 + 7200.0, limits)  # from the first arrival
