"""What a web page, a huge body or a flag cannot do: a page in the operator's browser cannot
steer a tokenless local server (foreign Origin, a form or text/plain POST, a rebound Host
name), a body over the limit is a 413 at once while other requests go on, and
--no-control-api leaves no route that reads or writes the trace without a token."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from fixtures.serving import LiveServer, asgi_client, make_engine

from control.api.limits import RequestLimits
from control.serve.settings import ServeSettings

JSON = {"Content-Type": "application/json"}


def run(engine, settings, calls):
    async def scenario():
        async with asgi_client(engine, settings) as client:
            return [await client.request(method, path, **kw) for method, path, kw in calls]

    return asyncio.run(scenario())


def test_a_page_in_the_browser_cannot_steer_a_tokenless_server(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    replies = run(engine, settings, [
        ("POST", "/control/drain", {"headers": {"Origin": "http://evil.example"},
                                    "json": {}}),
        ("POST", "/control/drain", {"content": b"{}", "headers": {
            "Content-Type": "text/plain"}}),
        ("POST", "/control/drain", {}),  # a no-cors fetch with no body
        ("POST", "/control/drain", {"json": {}, "headers": {"Host": "rebound.example"}}),
        ("GET", "/control/config", {"headers": {"Host": "rebound.example:8000"}}),
        ("POST", "/v1/whatif", {"content": b"a=1", "headers": {
            "Content-Type": "application/x-www-form-urlencoded"}}),
        ("GET", "/control/config", {}),
    ])
    statuses = [r.status_code for r in replies]
    assert statuses == [403, 415, 415, 421, 421, 415, 200], [r.text for r in replies]
    assert replies[0].json()["error"]["param"] == "Origin"
    assert replies[6].json()["admission"] == "open"  # nothing above drained it


def test_the_operators_own_clients_still_steer_it(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    replies = run(engine, settings, [
        ("POST", "/control/drain", {"json": {"reason": "deploy"}}),
        ("POST", "/control/resume", {"content": b"", "headers": JSON}),
        ("POST", "/control/drain", {"json": {}, "headers": {
            "Origin": "http://127.0.0.1", "Host": "127.0.0.1"}}),
        ("GET", "/control/config", {"headers": {"Host": "localhost:8000"}}),
    ])
    assert [r.status_code for r in replies] == [200, 200, 200, 200], [r.text for r in replies]


def test_with_tokens_another_host_name_is_served(tiny_loaded, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("ops admin ops-secret-1\n")
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", control_tokens_path=str(tokens)))
    reply, = run(engine, settings, [("GET", "/control/config", {"headers": {
        "Host": "batchpilot.internal", "Authorization": "Bearer ops-secret-1"}})])
    assert reply.status_code == 200, reply.text


def test_no_control_api_still_needs_tokens_for_whatif_and_loadtest_results(
        tiny_loaded, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("ops admin ops-secret-1\nviewer read view-secret-1\n")
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", control_api=False, control_tokens_path=str(tokens),
        trace_db=str(tmp_path / "trace.duckdb")))
    read = {"Authorization": "Bearer view-secret-1"}
    replies = run(engine, settings, [
        ("POST", "/v1/whatif", {"json": {"set": {"max_num_seqs": 2}}}),
        ("POST", "/v1/loadtest/results", {"json": {"runs": []}}),
        ("POST", "/v1/loadtest/results", {"json": {"runs": []}, "headers": read}),
        ("GET", "/control/config", {"headers": read}),
    ])
    assert [r.status_code for r in replies] == [401, 401, 403, 404], [r.text for r in replies]


def test_a_body_over_the_limit_is_a_413_naming_it(tiny_loaded):
    """Every 413, whether its Content-Length said so or the chunks passed the limit while
    the body was read, names the limit (message and `param`) and closes the connection."""
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", limits=RequestLimits(max_body_bytes=1000)))

    async def chunks():
        for _ in range(4):
            yield b" " * 400

    replies = run(engine, settings, [
        ("POST", "/v1/completions", {"content": b"x" * 1001, "headers": JSON}),
        ("POST", "/v1/completions", {"content": chunks(), "headers": JSON}),  # chunked
        ("POST", "/tokenize", {"content": chunks(), "headers": JSON}),  # reads its own body
        ("POST", "/v1/completions", {"json": {"prompt": "hi", "max_tokens": 2}}),
    ])
    assert [r.status_code for r in replies] == [413, 413, 413, 200], [r.text for r in replies]
    for reply in replies[:3]:
        assert reply.json()["error"]["code"] == "body_too_large"
        assert "max_body_bytes" in reply.json()["error"]["message"]
        assert reply.json()["error"]["param"] == "max_body_bytes", reply.text
        assert reply.headers["connection"] == "close"
    messages = [r.json()["error"]["message"] for r in replies[:2]]
    assert messages[0] == ("the request body has 1001 bytes, more than the limit of 1000"
                           " bytes (limit max_body_bytes)")  # its Content-Length said so
    assert messages[1].startswith("the request body has more bytes than the limit of 1000")


@pytest.mark.timeout(120)
def test_a_64_mb_body_is_answered_at_once_and_nobody_else_waits(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.005)
    with LiveServer(engine, settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        innocent: list[float] = []

        def stream_beside() -> None:
            started = time.monotonic()
            reply = client.post("/v1/completions", json={
                "prompt": "hello there", "max_tokens": 32, "ignore_eos": True})
            assert reply.status_code == 200
            innocent.append(time.monotonic() - started)

        beside = threading.Thread(target=stream_beside)
        beside.start()
        started = time.monotonic()
        big = b'{"prompt": "' + b"a" * (64 << 20) + b'"}'
        reply = httpx.post(f"{url}/v1/completions", content=big, headers=JSON, timeout=60)
        took = time.monotonic() - started
        beside.join(60)
    engine.stop()
    assert reply.status_code == 413, reply.text
    assert took < 20, f"the 413 took {took:.1f} s"
    assert innocent and innocent[0] < 20


def test_a_public_server_without_tokens_serves_any_host_name(tiny_loaded):
    """--host 0.0.0.0 --no-control-api (no tokens, no trace: allowed) checks no Host name:
    that check is a loopback server's, and here every client calls it by its own name."""
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", host="0.0.0.0", edge="off", control_api=False))
    reply, = run(engine, settings, [("POST", "/v1/completions", {
        "json": {"prompt": "hi", "max_tokens": 2},
        "headers": {"Host": "batchpilot.internal:8000"}})])
    assert reply.status_code == 200, reply.text
