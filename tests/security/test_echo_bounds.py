"""A client's value quoted in an error comes back clipped (control/api/errors.py `shown`):
a 1 MB model name or a URL-long request id is not echoed whole, the message still names
the value's start and its length, and a request beside it is served as usual."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.errors import ECHO_CHARS, MAX_MESSAGE_CHARS, APIError, shown
from control.serve.settings import ServeSettings

LONG = "m" * 1_000_000
BOUND = 400  # characters: the longest message below, with its value clipped


@pytest.fixture(scope="module")
def api(tiny_loaded, tmp_path_factory):
    trace = tmp_path_factory.mktemp("echo") / "trace.duckdb"
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", trace_db=str(trace)))
    yield engine, settings
    engine.stop()


def exchange(api, calls: list[tuple[str, str, dict]]) -> list:
    """(method, path, kwargs) each on one client, all at once; the replies in order."""
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await asyncio.gather(*(client.request(method, path, **kwargs)
                                          for method, path, kwargs in calls))

    return asyncio.run(scenario())


def test_a_megabyte_model_name_is_a_short_404_and_its_neighbour_is_served(api):
    bad, good = exchange(api, [
        ("POST", "/v1/completions", {"json": {"model": LONG, "prompt": "x", "max_tokens": 2}}),
        ("POST", "/v1/completions", {"json": {"prompt": "hello", "max_tokens": 2}})])
    assert bad.status_code == 404, bad.text[:300]
    message = bad.json()["error"]["message"]
    assert len(message) < BOUND and len(bad.content) < 2 * BOUND, message
    assert f"'{'m' * ECHO_CHARS}'... (1,000,000 characters) does not exist" in message
    assert bad.json()["error"]["param"] == "model"
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("method,path,kwargs,param", [
    ("GET", "/v1/trace/requests/" + "r" * 6000, {}, None),
    ("GET", "/v1/trace/series/" + "k" * 6000, {}, None),
    ("GET", "/v1/trace/export/" + "t" * 6000, {}, None),
    ("POST", "/v1/completions", {"json": {"prompt": "x", "max_tokens": 2},
                                 "headers": {"X-Priority": "9" * 6000}}, None),
], ids=["request-id", "series", "export-table", "header-int"])
def test_long_values_in_paths_and_headers_come_back_clipped(api, method, path, kwargs, param):
    reply, = exchange(api, [(method, path, kwargs)])
    assert 400 <= reply.status_code < 500, reply.text[:300]
    message = reply.json()["error"]["message"]
    assert len(message) < BOUND, message
    assert "(6,000 characters)" in message, message


def test_shown_quotes_short_values_whole_and_clips_long_ones():
    assert shown("tiny") == "'tiny'"
    assert shown(None) == "None"
    assert shown("ab" * 50, 10) == "'ababababab'... (100 characters)"
    assert shown(["x"] * 40, 8) == "\"['x', 'x\"... (200 characters)"


def test_no_error_message_leaves_longer_than_the_cap():
    body = APIError(400, "y" * (3 * MAX_MESSAGE_CHARS)).body()["error"]
    assert len(body["message"]) < MAX_MESSAGE_CHARS + 60, len(body["message"])
    assert body["message"].endswith(f"(clipped from {3 * MAX_MESSAGE_CHARS:,} characters)")


def test_a_value_of_exactly_the_echo_limit_is_quoted_whole(api):
    """ECHO_CHARS is what a message quotes whole: a model name of exactly that length comes
    back as sent, one character more is clipped."""
    at, over = "m" * ECHO_CHARS, "m" * (ECHO_CHARS + 1)
    replies = exchange(api, [("POST", "/v1/completions", {"json": {"model": name,
                                                                   "prompt": "x"}})
                             for name in (at, over)])
    messages = [reply.json()["error"]["message"] for reply in replies]
    assert f"{at!r} does not exist" in messages[0], messages[0]
    assert f"{at!r}... ({ECHO_CHARS + 1} characters)" in messages[1], messages[1]
