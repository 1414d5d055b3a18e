"""Property: whatever a client puts in the sampling fields, it gets an answer below 500 (a
4xx naming what is wrong, or a 200 when the values are fine), and greedy requests decoding
beside it end exactly as they do alone: same status, text, finish reason and token count.
Nothing a request carries reaches a tensor index unchecked, so nothing it sends can fail
the batch its neighbours are in."""

from __future__ import annotations

import asyncio
import json

import pytest
from fixtures.serving import asgi_client, make_engine
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from control.api.limits import RequestLimits
from control.serve.settings import ServeSettings

INNOCENTS = [{"prompt": f"innocent request {i} asks about paged attention",
              "max_tokens": 12, "temperature": 0, "ignore_eos": True} for i in range(3)]

_int = st.one_of(st.integers(-3, 3), st.integers(-(2**70), 2**70),
                 st.sampled_from([0, 1, 2, 49151, 49152, 2**31, 2**63, -(2**63) - 1]))
_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, 0.5, 1.0, 2.0, -2.0, 100.0, 1e300]))
_text = st.text(st.characters(exclude_categories=()), max_size=40)  # lone surrogates too
_id_list = st.lists(_int, max_size=6)
_scalar = st.one_of(_int, _float, _text, st.booleans(), st.none())
_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)), max_leaves=12)

FIELDS = {
    "max_tokens": _int, "temperature": _float, "top_p": _float, "top_k": _int, "seed": _int,
    "n": _int, "presence_penalty": _float, "frequency_penalty": _float,
    "repetition_penalty": _float, "min_p": _float, "min_tokens": _int,
    "stop_token_ids": st.one_of(_id_list, _json), "logprobs": st.one_of(_int, st.booleans()),
    "prompt_logprobs": _int, "priority": _int, "user": _text, "cache_salt": _text,
    "stop": st.one_of(_text, st.lists(_text, max_size=20)), "ignore_eos": _scalar,
    "logit_bias": st.one_of(st.dictionaries(st.one_of(_text, _int.map(str)), _float,
                                            max_size=5), _json),
    "response_format": st.one_of(st.just({"type": "json_object"}), _json),
    "best_of": _int, "echo": _scalar, "top_logprobs": _int, "prompt": st.one_of(
        _text, _id_list, st.lists(_id_list, max_size=2)),
}
poison_bodies = st.fixed_dictionaries({}, optional=FIELDS)


@pytest.fixture(scope="module")
def served(tiny_loaded):
    limits = RequestLimits(max_generated_tokens=96)  # a valid poison stays short
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", limits=limits))
    yield engine, settings
    engine.stop()


async def _outcome(client, path: str, body: dict) -> tuple:
    reply = await client.post(path, json=body)
    if reply.status_code != 200:
        return (reply.status_code,)
    data = reply.json()
    choice = data["choices"][0]
    return (200, choice.get("text"), choice["finish_reason"],
            data["usage"]["completion_tokens"])


def _run(served, poison: dict | None, path: str) -> tuple[list[tuple], int | None, str]:
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            tasks = [asyncio.ensure_future(_outcome(client, "/v1/completions", body))
                     for body in INNOCENTS]
            status, text = None, ""
            if poison is not None:
                raw = json.dumps({"model": "tiny", **poison}, allow_nan=True)
                reply = await client.post(path, content=raw.encode(),
                                          headers={"Content-Type": "application/json"})
                status, text = reply.status_code, reply.text
            return [await t for t in tasks], status, text

    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def alone(served):
    outcomes, _, _ = _run(served, None, "")
    assert all(o[0] == 200 for o in outcomes), outcomes
    return outcomes


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(poison=poison_bodies)
@example(poison={"max_tokens": 4, "min_tokens": 2, "stop_token_ids": [-1000000]})
@example(poison={"max_tokens": 4, "min_tokens": 2, "stop_token_ids": [10**9]})
@example(poison={"max_tokens": 4, "user": "用户"})
@example(poison={"max_tokens": 4, "logit_bias": {"²": 5}})
@example(poison={"max_tokens": 4, "cache_salt": "\ud800"})  # once ended the batch
def test_no_sampling_field_can_fail_a_neighbour(served, alone, path, poison):
    if path.endswith("chat/completions"):
        poison.pop("prompt", None)
        poison["messages"] = [{"role": "user", "content": "poison"}]
    else:
        poison.setdefault("prompt", "poison")
    outcomes, status, text = _run(served, poison, path)
    assert status is not None and status < 500, (status, text, poison)
    assert outcomes == alone, (poison, status, text)
