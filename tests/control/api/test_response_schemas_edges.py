"""The answers' shapes (control/api/response_schemas.py) as clients see them: what
/openapi.json requires of each answer (generated clients make the rest optional), token
counts as integers, null for a phase never reached and a target not set, and /v1/models'
owner. On the server app without its engine (built only when started)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from control.api.app import create_app
from control.api.response_schemas import BatchpilotInfo, SLOTargets, Timing, Usage
from control.serve.settings import ServeSettings


@pytest.fixture(scope="module")
def client() -> TestClient:
    # loopback: the server answers only requests addressed to a loopback name
    return TestClient(create_app(ServeSettings(model="tiny")), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def shapes(client) -> dict[str, dict]:
    reply = client.get("/openapi.json")
    assert reply.status_code == 200, reply.text
    return reply.json()["components"]["schemas"]


@pytest.mark.parametrize(("shape", "required"), [
    ("ChatCompletionResponse", {"id", "created", "model", "choices", "usage", "batchpilot"}),
    ("BatchpilotInfo", {"request_id", "lane", "tenant", "priority"}),
    ("Usage", {"prompt_tokens", "completion_tokens", "total_tokens"}),
    ("TopLogprob", {"token", "logprob", "bytes"}),
    ("ModelCard", {"id", "created", "max_model_len"}),
    ("ErrorDetail", {"message", "type"}),
])
def test_openapi_requires_what_every_answer_carries(shapes, shape, required):
    assert set(shapes[shape]["required"]) == required


def test_token_counts_are_documented_and_sent_as_integers(shapes):
    props = shapes["Usage"]["properties"]
    assert {name: p["type"] for name, p in props.items()} == {
        "prompt_tokens": "integer", "completion_tokens": "integer", "total_tokens": "integer"}
    usage = Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5)
    assert usage.model_dump_json() == '{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}'


def test_a_phase_never_reached_and_a_target_not_set_are_null():
    """An answer without the engine's record (refused before it ran) times nothing; a lane
    with a TTFT target only has no TPOT target (0 s would fail every request)."""
    info = BatchpilotInfo(request_id="r1", lane="interactive", tenant="acme", priority=0)
    assert set(info.model_dump()["timing"].values()) == {None}
    assert Timing(queue_delay_s=None, ttft_s=0.25).queue_delay_s is None
    assert SLOTargets(ttft_s=0.5).model_dump() == {"ttft_s": 0.5, "tpot_s": None}
    assert info.slo is None and info.usage is None


def test_models_are_owned_by_batchpilot(client):
    reply = client.get("/v1/models")
    assert reply.status_code == 200, reply.text
    [card] = reply.json()["data"]
    assert (card["id"], card["object"], card["owned_by"]) == ("tiny", "model", "batchpilot")
    assert isinstance(card["max_model_len"], int)
