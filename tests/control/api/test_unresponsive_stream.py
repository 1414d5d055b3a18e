"""A stream of n choices whose engine never ends an aborted request (EngineUnresponsive):
each unfinished choice gets its own final chunk, under its own index, finish_reason
"error" and the engine_unresponsive error, then one [DONE]."""

from __future__ import annotations

import asyncio
import json

import pytest

from control.api.generation import EngineUnresponsive
from control.api.openai_format import ResponseFormat
from control.api.request_meta import RequestMeta
from control.api.responses import _sse_body


class Stuck:
    """A choice's Generation whose engine never answers."""

    async def next_event(self):
        raise EngineUnresponsive("aborted but never ended")


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_every_stuck_choice_ends_under_its_own_index(kind):
    fmt = ResponseFormat(kind, "r", "tiny", 3, RequestMeta("t", None, 0, None, 10.0))

    async def collect():
        return [chunk async for chunk in _sse_body([Stuck(), Stuck(), Stuck()], fmt)]

    raw = asyncio.run(collect())
    assert raw[-1] == b"data: [DONE]\n\n" and raw.count(b"data: [DONE]\n\n") == 1
    chunks = [json.loads(c[6:]) for c in raw[:-1]]
    finals = [c["choices"][0] for c in chunks if c["choices"][0].get("finish_reason")]
    assert [f["index"] for f in finals] == [0, 1, 2]
    assert all(f["finish_reason"] == "error" for f in finals)
    assert all(c["error"]["code"] == "engine_unresponsive" for c in chunks if "error" in c)
    assert sum("error" in c for c in chunks) == 3
