"""bench.stream_client's framing: the serving benches' figures count what it parses."""

import json

from bench.stream_client import dechunk, parse_reply


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_dechunk_joins_events_split_across_chunks_and_drops_extensions():
    events = sse({"a": 1}) + sse({"b": 2})
    body = chunked(events[:5], events[5:17], events[17:])
    body = body.replace(b"5\r\n", b"5;ext=1\r\n", 1)
    assert dechunk(body) == events


def test_dechunk_keeps_what_arrived_when_cut_short():
    assert dechunk(b"5\r\nhello\r\n3\r\nwo") == b"hellowo"


def test_parse_reply_reads_usage_and_errors_from_a_streamed_reply():
    events = (sse({"choices": [{"text": "x", "finish_reason": None}]})
              + sse({"choices": [{"text": "", "finish_reason": "length"}]})
              + sse({"choices": [], "usage": {"completion_tokens": 7}}) + b"data: [DONE]\n\n")
    raw = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events[:40], events[40:]))
    reply = parse_reply(raw, closed_at=3.5)
    assert (reply.status, reply.closed_at, len(reply.events)) == (200, 3.5, 3)
    assert reply.completion_tokens() == 7 and not reply.errored()
    failed = sse({"choices": [{"text": "", "finish_reason": "error"}]})
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(failed)
    assert parse_reply(raw, 0.0).errored()


def test_parse_reply_counts_nothing_from_a_refusal():
    body = json.dumps({"error": {"message": "data: {no", "code": "slo_unreachable"}}).encode()
    raw = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\nretry-after: 2\r\n\r\n"
           % len(body) + body)
    reply = parse_reply(raw, 0.0)
    assert reply.status == 429 and reply.events == [] and reply.completion_tokens() == 0
