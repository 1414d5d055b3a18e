"""The load tester's transport for a server on its own machine: replies parsed after they
end, each SSE line timed by the read that completed it (what TTFT and ITL are made of),
framing errors and silences named, and the serving bench's client built on it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from bench.stream_client import stream_result
from control.loadtest.local_streams import local_streams
from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.runner import run
from control.loadtest.sse_transport import ReplyError, ReplyTimeout, parse, post, request_bytes

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_each_line_is_timed_by_the_read_that_completed_it():
    first, second = sse({"n": 1}), sse({"n": 2})
    # the first event's line ends in the second read; the second event arrives whole
    reads = [(1.0, HEAD + chunk(first[:7])), (2.0, chunk(first[7:])),
             (3.0, chunk(second) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")]
    reply = parse(reads)
    assert reply.status == 200 and reply.complete and reply.ended_at == 3.0
    assert [(t, json.loads(d)) for t, d in reply.data_lines[:2]] == [(2.0, {"n": 1}),
                                                                      (3.0, {"n": 2})]
    assert reply.data_lines[2] == (3.0, b"[DONE]")


def test_chunk_extensions_and_a_line_break_split_from_its_line():
    event = sse({"n": 1})
    reads = [(1.0, HEAD + b"%x;ext=1\r\n" % (len(event) - 2) + event[:-2] + b"\r\n"),
             (5.0, chunk(b"\n\n") + b"0\r\n\r\n")]
    reply = parse(reads)
    assert reply.data_lines == [(5.0, event[6:-2])]  # complete when its "\n" came


def test_a_reply_cut_short_keeps_what_arrived_and_says_so():
    event = sse({"n": 1})
    reply = parse([(1.0, HEAD + chunk(event) + b"40\r\ndata: {\"n\"")])
    assert not reply.complete and json.loads(reply.data_lines[0][1]) == {"n": 1}
    with pytest.raises(ConnectionError):
        stream_result([(1.0, HEAD + chunk(event) + b"40\r\ndata: {\"n\"")])


def test_a_refusal_with_a_content_length_body():
    body = json.dumps({"error": {"message": "data: {no", "code": "slo_unreachable"}}).encode()
    raw = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\nRetry-After: 2\r\n\r\n"
           % len(body) + body)
    reply = parse([(1.0, raw[:30]), (1.5, raw[30:])])
    assert (reply.status, reply.complete, reply.headers["retry-after"]) == (429, True, "2")
    assert json.loads(reply.body)["error"]["code"] == "slo_unreachable"
    result = stream_result([(1.0, raw)])
    assert result.status == 429 and result.events == [] and result.completion_tokens() == 0


def test_usage_and_a_named_failure_from_the_bench_client_view():
    events = (sse({"choices": [{"text": "x", "finish_reason": None}]})
              + sse({"choices": [], "usage": {"completion_tokens": 7}}) + b"data: [DONE]\n\n")
    result = stream_result([(1.0, HEAD + chunk(events) + b"0\r\n\r\n")])
    assert result.completion_tokens() == 7 and not result.errored()
    failed = sse({"choices": [{"text": "", "finish_reason": "error"}]})
    assert stream_result([(1.0, HEAD + chunk(failed) + b"0\r\n\r\n")]).errored()


@pytest.mark.parametrize("raw", [b"", b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1\r\n\r\n",
                                 HEAD + b"zz\r\nabc"])
def test_what_is_not_an_http_reply_is_a_named_error(raw):
    with pytest.raises(ReplyError):
        parse([(1.0, raw)] if raw else [])


def test_a_header_cannot_split_the_request():
    assert b"X-Tenant: acme\r\n" in request_bytes("h", 1, "/p", b"{}", {"X-Tenant": "acme"})
    assert b"Host: [::1]:9\r\n" in request_bytes("::1", 9, "/p", b"{}", {})
    with pytest.raises(ValueError, match="line break"):
        request_bytes("h", 1, "/p", b"{}", {"X-Tenant": "acme\r\nX-Admin: 1"})
    with pytest.raises(ValueError, match="line break"):
        request_bytes("h", 1, "/p", b"{}", {"X-Admin: 1\r\nX-Tenant": "acme"})


PIECE_GAP_S = 0.05  # between two pieces of a reply sent as a list


@pytest.fixture
def silent_server():
    """A TCP server that accepts one connection, reads (the request is appended to
    `reply`), sends `reply[0]` (a list: its pieces PIECE_GAP_S apart), then stays silent,
    or closes when `reply[1]` (when "if asked": only if the request said Connection: close,
    as an HTTP/1.1 server keeps a connection open unless told)."""
    sock = socket.create_server(("127.0.0.1", 0))
    reply: list = [b"", False]
    conns = []

    def serve():
        conn, _ = sock.accept()
        conns.append(conn)
        reply.append(conn.recv(65536))
        pieces = reply[0] if isinstance(reply[0], list) else [reply[0]]
        try:
            for i, piece in enumerate(pieces):
                time.sleep(PIECE_GAP_S if i else 0)
                conn.sendall(piece)
        except OSError:  # the client closed first (a reply over its size bound)
            return
        if reply[1] == "if asked":
            if b"connection: close\r\n" in reply[2].lower():
                conn.close()
        elif reply[1]:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], reply
    thread.join(5)
    for conn in conns:
        conn.close()
    sock.close()


def test_a_server_that_stops_sending_times_out_between_reads(silent_server):
    port, reply = silent_server
    reply[0] = HEAD + chunk(sse({"n": 1}))
    request = request_bytes("127.0.0.1", port, "/v1/completions", b"{}", {})
    with pytest.raises(ReplyTimeout, match="0.3 s"):
        asyncio.run(post("127.0.0.1", port, request, timeout_s=0.3))


def test_a_stream_longer_than_the_timeout_is_read_while_its_chunks_keep_coming(silent_server):
    """timeout_s bounds the silence between reads, not the whole reply."""
    port, reply = silent_server
    reply[:] = [[HEAD, *(chunk(sse({"n": i})) for i in range(10)), b"0\r\n\r\n"], True]
    request = request_bytes("127.0.0.1", port, "/v1/completions", b"{}", {})
    started = time.monotonic()
    reads = asyncio.run(post("127.0.0.1", port, request, timeout_s=0.3))
    assert time.monotonic() - started > 0.3  # eleven pieces 0.05 s apart
    assert parse(reads).complete and len(parse(reads).data_lines) == 10


def test_a_refused_connection_is_an_os_error():
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OSError):
        asyncio.run(post("127.0.0.1", port, b"", timeout_s=1.0))


def one_stream(port: int, timeout_s: float, cancel_after_s: float | None = None,
               ) -> RequestResult:
    plan = [PlannedRequest(0, 0.0, 3, 2, "acme", None, True, cancel_after_s)]
    results, _ = asyncio.run(run(f"http://127.0.0.1:{port}", plan, {0: "hi"}, model="m",
                                 timeout_s=timeout_s, local=True))
    return results[0]


def test_the_runner_names_a_stream_cut_short_and_keeps_its_chunks(silent_server):
    port, reply = silent_server
    reply[:] = [HEAD + chunk(sse({"choices": [{"text": "a", "finish_reason": None}]})), True]
    result = one_stream(port, timeout_s=5.0)
    assert result.outcome == "error" and "before its end" in result.error
    assert len(result.chunk_times_s) == 1 and result.e2e_s > 0


def test_the_runner_times_out_a_silent_stream(silent_server):
    port, reply = silent_server
    reply[0] = HEAD + chunk(sse({"choices": [{"text": "a", "finish_reason": None}]}))
    result = one_stream(port, timeout_s=0.3)
    assert result.outcome == "timeout" and result.error == "no answer within 0.3 s"


@pytest.mark.parametrize(("url", "local"), [
    ("http://127.0.0.1:8000", ("127.0.0.1", 8000, "/v1/completions")),
    ("http://localhost:8000/prefix/", ("localhost", 8000, "/prefix/v1/completions")),
    ("http://[::1]:9/", ("::1", 9, "/v1/completions")),
    ("https://127.0.0.1:8000", None),  # TLS: httpx's
    ("http://example.com:8000", None),  # another machine: pooled connections keep
])                                      # connects out of TTFT
def test_which_servers_get_the_local_transport(url, local):
    streams = local_streams(url, {}, 1.0)
    assert (streams and (streams.host, streams.port, streams.path)) == (local or None)


def test_a_client_that_gives_up_keeps_the_chunks_that_came_before(silent_server):
    port, reply = silent_server
    reply[0] = HEAD + chunk(sse({"choices": [{"text": "a", "finish_reason": None}]}))
    result = one_stream(port, timeout_s=5.0, cancel_after_s=0.3)
    assert result.outcome == "cancelled" and result.http_status == 200
    assert len(result.chunk_times_s) == 1 and 0 < result.ttft_s < 0.3 <= result.e2e_s


def test_a_reply_past_the_size_bound_is_cut_and_named(silent_server):
    """A reply is kept whole until it ends, so its size is bounded (MAX_REPLY_BYTES): a
    server that streams without end costs the client that much memory, then an error."""
    port, reply = silent_server
    reply[0] = HEAD + chunk(b"data: " + b"x" * 5000 + b"\n\n")
    request = request_bytes("127.0.0.1", port, "/v1/completions", b"{}", {})
    with pytest.raises(ReplyError, match="passed 1000 bytes"):
        asyncio.run(post("127.0.0.1", port, request, timeout_s=5.0, max_bytes=1000))


def test_a_reply_of_many_small_reads_is_bounded_by_their_sum(silent_server):
    port, reply = silent_server
    reply[:] = [[HEAD, *(chunk(b"data: " + b"x" * 200 + b"\n\n") for _ in range(10))], True]
    request = request_bytes("127.0.0.1", port, "/v1/completions", b"{}", {})
    with pytest.raises(ReplyError, match="passed 1000 bytes"):
        asyncio.run(post("127.0.0.1", port, request, timeout_s=5.0, max_bytes=1000))


def test_a_server_that_keeps_connections_open_ends_the_reply_when_asked(silent_server):
    """The transport reads a reply to the close, so each request says Connection: close:
    a server keeping the connection open would hold every stream to its timeout."""
    port, reply = silent_server
    done = sse({"choices": [{"text": "a", "finish_reason": "length"}]}) + b"data: [DONE]\n\n"
    reply[:] = [HEAD + chunk(done) + b"0\r\n\r\n", "if asked"]
    result = one_stream(port, timeout_s=2.0)
    assert result.outcome == "ok" and result.e2e_s < 1.0


def test_a_first_send_says_it_is_no_resend(silent_server):
    """X-Stainless-Retry-Count is 0 on a first send over the local transport (the server
    counts a request with a higher count as a late resend)."""
    port, reply = silent_server
    done = sse({"choices": [{"text": "a", "finish_reason": "length"}]}) + b"data: [DONE]\n\n"
    reply[:] = [HEAD + chunk(done) + b"0\r\n\r\n", True]
    result = one_stream(port, timeout_s=5.0)
    assert result.outcome == "ok" and b"X-Stainless-Retry-Count: 0\r\n" in reply[2]
