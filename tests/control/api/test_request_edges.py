"""A request's edges, asked directly with no engine: its routing headers
(control/api/request_meta.py: their bounds, units, clock and which copy wins) and the text
check at the door (control/api/text_check.py: every surrogate escape, every changing method,
every chunk of a body)."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.datastructures import Headers

from control.api.errors import APIError
from control.api.request_meta import MAX_MS, read_meta
from control.api.text_check import UnicodeBody, _refusal

NOW = 1000.0  # the request's arrival on the engine clock (s)


def meta(headers: dict[str, str] | list[tuple[str, str]] = (), user: str | None = None,
         priority: int | None = None, max_timeout_s: float = 600.0):
    items = headers.items() if isinstance(headers, dict) else headers
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in items]
    return read_meta(Headers(raw=raw), user, priority, now=NOW, max_timeout_s=max_timeout_s)


def refused(headers: dict[str, str] | list[tuple[str, str]], **kwargs) -> str:
    """The param the 400 names."""
    with pytest.raises(APIError) as caught:
        meta(headers, **kwargs)
    assert caught.value.status == 400
    return caught.value.param


# ---- routing headers ------------------------------------------------------------------
def test_x_priority_is_exactly_32_bits():
    assert meta({"X-Priority": str(2**31 - 1)}).priority == 2**31 - 1
    assert meta({"X-Priority": str(-2**31)}).priority == -2**31
    assert refused({"X-Priority": str(2**31)}) == "X-Priority"
    assert refused({"X-Priority": str(-2**31 - 1)}) == "X-Priority"


def test_a_deadline_is_milliseconds_after_arrival_on_the_engine_clock():
    assert meta({"X-Deadline-Ms": "1500"}).deadline == pytest.approx(NOW + 1.5)
    assert meta({"X-Deadline-Ms": str(MAX_MS)}).deadline == pytest.approx(NOW + MAX_MS / 1000)
    assert meta({}).deadline is None
    assert refused({"X-Deadline-Ms": "0"}) == "X-Deadline-Ms"
    assert refused({"X-Deadline-Ms": str(MAX_MS + 1)}) == "X-Deadline-Ms"


def test_a_timeout_is_milliseconds_capped_by_the_server():
    assert meta({"X-Request-Timeout-Ms": "500"}).timeout_s == pytest.approx(0.5)
    assert meta({"X-Request-Timeout-Ms": "3600000"}, max_timeout_s=60.0).timeout_s == 60.0
    assert meta({}, max_timeout_s=60.0).timeout_s == 60.0
    assert refused({"X-Request-Timeout-Ms": "-1"}) == "X-Request-Timeout-Ms"


@pytest.mark.parametrize("lane", ["l" * 129, "bat\x1bch", "a\x7fb", "line\nbreak"])
def test_a_lane_header_is_a_name_checked_like_a_tenant(lane):
    assert refused({"X-Lane": lane}) == "X-Lane"
    assert meta({"X-Lane": "  batch "}).lane == "batch"
    assert meta({"X-Lane": " "}).lane is None and meta({}).lane is None


def test_x_tenant_wins_over_the_bodys_user():
    """A gateway's X-Tenant decides the tenant whatever the client's body says."""
    assert meta({"X-Tenant": "acme"}, user="mallory").tenant == "acme"
    assert meta({}, user="bob").tenant == "bob"
    assert meta({}).tenant == "default"
    assert refused({}, user="a\x00b") == "user"


def test_a_utf8_header_is_read_as_utf8():
    """ASGI servers hand header bytes over as Latin-1: a gateway's UTF-8 tenant is its
    name, not mojibake."""
    sent = "租户-α".encode().decode("latin-1")
    assert meta({"X-Tenant": sent}).tenant == "租户-α"
    assert meta({"X-Lane": sent}).lane == "租户-α"


def test_a_retry_count_of_0_is_a_first_send():
    assert meta({"X-Stainless-Retry-Count": "0"}).resent is False
    assert meta({}).resent is False
    assert meta({"X-Stainless-Retry-Count": "2"}).resent is True
    assert refused({"X-Stainless-Retry-Count": "1001"}) == "X-Stainless-Retry-Count"


@pytest.mark.parametrize("name", ["X-Tenant", "X-Lane", "X-Priority", "X-Deadline-Ms",
                                  "X-Request-Timeout-Ms"])
def test_each_routing_header_sent_twice_is_a_400_naming_it(name):
    """A gateway that appends its value after the client's must not leave the client's in
    force."""
    assert refused([(name, "1"), (name, "2")]) == name


# ---- the text check at the door --------------------------------------------------------
@pytest.mark.parametrize("escape", ["\\ud800", "\\uD800", "\\uDBFF", "\\udc00", "\\uDFFF",
                                    "\\uDc0A"])
def test_a_surrogate_escape_in_any_case_or_half_is_refused(escape):
    error = _refusal(b'{"prompt": "say ' + escape.encode() + b'"}')
    assert error is not None and error.status == 400 and error.param == "body.prompt"
    assert _refusal(b'{"prompt": "\\uD83D\\uDE00 \\ud83d\\ude00"}') is None  # pairs


def test_a_lone_surrogate_in_a_key_or_a_nested_list_is_named():
    body = {"messages": [{"role": "user", "content": ["ok", {"text": "\ud800"}]}]}
    error = _refusal(json.dumps(body).encode())
    assert error is not None and error.param == "body.messages.0.content.1.text"
    error = _refusal(json.dumps({"ok": {"\udc01": 1}}).encode())
    assert error is not None and error.param == "body.ok (a key)"


def _through(method: str, chunks: list[bytes], then: dict | None = None):
    """(the status answered, the messages the inner app received) for a body sent in
    `chunks` through UnicodeBody, then `then` (a disconnect) when given."""
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    if then is not None:
        incoming[-1]["more_body"] = True
        incoming.append(then)
    seen, sent = [], []

    async def receive():  # past the body: a real server would wait for the next event
        return incoming.pop(0) if incoming else {"type": "nothing-yet"}

    async def send(message):
        sent.append(message)

    async def inner(scope, receive, send):
        seen.append(await receive())
        if then is not None:
            seen.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    scope = {"type": "http", "method": method, "path": "/control/config", "headers": []}
    asyncio.run(UnicodeBody(inner)(scope, receive, send))
    return sent[0]["status"], seen


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_body_sent_by_any_changing_method_is_checked(method):
    assert _through(method, [b'{"reason": "\\ud800"}'])[0] == 400
    assert _through(method, [b'{"reason": "fine"}'])[0] == 200


def test_a_surrogate_in_a_later_chunk_is_refused_and_a_good_body_arrives_whole():
    assert _through("POST", [b'{"prompt": "' + b"a" * 100, b'\\udfff"}'])[0] == 400
    status, seen = _through("POST", [b'{"prompt": ', b'"hi"}'])
    assert status == 200 and seen[0]["body"] == b'{"prompt": "hi"}'


def test_a_disconnect_met_while_reading_reaches_the_route():
    status, seen = _through("POST", [b'{"prompt": "hi"'], then={"type": "http.disconnect"})
    assert seen[0]["body"] == b'{"prompt": "hi"' and seen[1]["type"] == "http.disconnect"
