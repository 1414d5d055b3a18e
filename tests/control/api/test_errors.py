"""Every error is OpenAI-shaped with the right status: 400 bad input, 404, 429 and 503 with
Retry-After, and a 500 that shows no stack trace."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.serving import asgi_client, make_engine, requests_ended, wait_until_idle

from control.api.errors import rejection_error
from control.api.response_schemas import ErrorResponse
from engine.calibration.step_law import StepLaw
from engine.records import AdmissionDecision
from engine.request import SamplingParams

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _check_error(resp, status: int, *needles: str) -> dict:
    assert resp.status_code == status, resp.text
    body = ErrorResponse.model_validate(resp.json()).error
    for needle in needles:
        assert needle in body.message, body.message
    assert "Traceback" not in resp.text
    return body.model_dump()


@pytest.mark.parametrize(("path", "body", "needles", "param"), [
    ("/v1/completions", {"prompt": "Hi", "n": 17}, ["n=17", "[1, 16]"], "n"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, ["max_tokens", "1"], "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": 3.5}, ["temperature", "2"],
     "temperature"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 0}, ["top_p"], "top_p"),
    ("/v1/completions", {"prompt": "Hi", "seed": -1}, ["seed"], "seed"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["ok", ""]}, ["non-empty"], "stop"),
    ("/v1/completions", {"prompt": ["a", "b"]}, ["one prompt per request"], "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, ["token ids", "99999"], "prompt"),
    ("/v1/completions", {"max_tokens": 3}, ["prompt", "Field required"], "prompt"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, ["logprobs", "20"], "logprobs"),
    ("/v1/chat/completions", {"messages": []}, ["messages"], "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, ["role"],
     "messages"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, ["n=0", "[1, 16]"], "n"),
    ("/v1/chat/completions", {"messages": [{"role": "system"}, *CHAT["messages"]]},
     ["a system message needs content"], "messages"),  # only an assistant's may have none
])
def test_bad_parameters_are_400(api, path, body, needles, param):
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.post(path, json=body)

    error = _check_error(asyncio.run(scenario()), 400, *needles)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize(("headers", "needle"), [
    ({"X-Deadline-Ms": "soon"}, "X-Deadline-Ms='soon' must be an integer"),
    ({"X-Deadline-Ms": "-5"}, "X-Deadline-Ms=-5 must be in 1.."),
    ({"X-Priority": "high"}, "X-Priority='high' must be an integer"),
    ({"X-Request-Timeout-Ms": "0"}, "X-Request-Timeout-Ms=0 must be in 1.."),
    ({"X-Stainless-Retry-Count": "again"}, "X-Stainless-Retry-Count='again' must be an"),
    ({"X-Stainless-Retry-Count": "-1"}, "X-Stainless-Retry-Count=-1 must be in 0..1000"),
    ({"X-Lane": "gold"}, "unknown lane 'gold'; the lanes are: interactive, long_context,"
                         " batch"),
])
def test_bad_headers_are_400(api, headers, needle):
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.post("/v1/completions", headers=headers,
                                     json={"prompt": "Hi", "max_tokens": 2})

    _check_error(asyncio.run(scenario()), 400, needle)


def test_bad_json_unknown_model_route_and_method(api):
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            bad_json = await client.post("/v1/completions", content=b"{bad",
                                         headers={"Content-Type": "application/json"})
            not_object = await client.post("/v1/chat/completions", json=[1, 2])
            model = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
            route = await client.get("/v1/nothing")
            method = await client.get("/v1/completions")
            return bad_json, not_object, model, route, method

    bad_json, not_object, model, route, method = asyncio.run(scenario())
    _check_error(bad_json, 400, "not valid JSON")
    _check_error(not_object, 400)
    assert _check_error(model, 404, "gpt-9", "tiny")["code"] == "model_not_found"
    _check_error(route, 404)
    _check_error(method, 405)


def test_prompt_over_max_model_len_names_the_limit_and_the_length(api, tiny_loaded):
    engine, settings = api
    prompt = "Hello world! How are you today? " * 60
    num_prompt = len(tiny_loaded.tokenizer.encode(prompt, add_special_tokens=False))
    assert num_prompt > 512

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            completion = await client.post("/v1/completions",
                                           json={"prompt": prompt, "max_tokens": 4})
            chat = await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": prompt}]})
            return completion, chat

    completion, chat = asyncio.run(scenario())
    error = _check_error(completion, 400, "512", f"{num_prompt} in the prompt")
    assert error["code"] == "context_length_exceeded"
    _check_error(chat, 400, "512", "in the prompt")  # default max_tokens: the rest, >= 1


def test_full_queue_is_429_with_retry_after(tiny_loaded):
    # One sequence runs at a time and one may wait: a long request runs, one waits behind
    # it, so the queue is full for as long as the first one runs.
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.01, max_num_seqs=1,
                                      max_waiting_requests=1)
    long = SamplingParams(max_tokens=200, ignore_eos=True)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            assert (await engine.call(lambda e: e.add_request("running", [5, 6, 7], long))
                    ).accepted
            while (await engine.call(lambda e: e.stats()))["running"] < 1:
                await asyncio.sleep(0.01)
            assert (await engine.call(lambda e: e.add_request("waiting", [5, 6, 8], long))
                    ).accepted
            resp = await client.post("/v1/chat/completions", json=CHAT)
            await engine.call(lambda e: (e.abort("running"), e.abort("waiting")))
            return resp

    resp = asyncio.run(scenario())
    error = _check_error(resp, 429, "max_waiting_requests")
    assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.headers["x-batchpilot-reject-reason"] == "queue_full"


def test_deadline_that_cannot_be_met_is_429(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    long_prompt = "Each block of the key value cache holds sixteen tokens. " * 20

    async def scenario():
        async with asgi_client(engine, settings) as client:
            warm = await client.post("/v1/completions", json={"prompt": long_prompt,
                                                              "max_tokens": 4})
            assert warm.status_code == 200  # the engine now knows its throughput
            tight = await client.post("/v1/completions", headers={"X-Deadline-Ms": "1"},
                                      json={"prompt": long_prompt, "max_tokens": 4})
            loose = await client.post("/v1/completions", headers={"X-Deadline-Ms": "60000"},
                                      json={"prompt": long_prompt, "max_tokens": 4})
            return tight, loose

    tight, loose = asyncio.run(scenario())
    assert _check_error(tight, 429, "deadline")["code"] == "deadline"
    assert int(tight.headers["retry-after"]) >= 1
    assert loose.status_code == 200


def test_a_request_the_queue_keeps_from_its_lanes_ttft_is_429_slo_unreachable(tiny_loaded,
                                                                              tmp_path):
    config = {"lanes": {"interactive": {"slo": {"ttft_s": 2.5}}},
              "serving": {"long_context_lane": None}}
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.01, max_num_seqs=1,
                                      config=config, tmp_path=tmp_path)
    law = StepLaw(0.01, 0.01, 0.0, 0.0)  # 10 ms a token: four 60-token prompts take 2.4 s
    long = SamplingParams(max_tokens=200, ignore_eos=True)

    def queue_up(e):
        e.scheduler.step_law = law  # the start-up fit's, as a server with fitted budgets has
        for i in range(4):  # each within 2.5 s of its arrival, behind the others
            assert e.add_request(f"q{i}", [5 + i] * 60, long).accepted

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await engine.call(queue_up)
            resp = await client.post("/v1/completions", json={  # ~100 tokens: 1 s alone
                "prompt": "Hi there " * 20, "max_tokens": 2})
            await engine.call(lambda e: [e.abort(f"q{i}") for i in range(4)])
            return resp

    resp = asyncio.run(scenario())
    error = _check_error(resp, 429, "slo.ttft_s", "2.5s")
    assert error["code"] == "slo_unreachable" and error["type"] == "rate_limit_error"
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.headers["x-batchpilot-reject-reason"] == "slo_unreachable"


def test_kv_above_reject_watermark_is_503(tiny_loaded):
    engine, spy, settings = make_engine(
        tiny_loaded, delay_s=0.05, num_kv_blocks=8, kv_cache_high_watermark=0.1,
        kv_cache_reject_watermark=0.2)
    prompt = "Each block of the key value cache holds sixteen tokens of one sequence."

    async def scenario():
        async with asgi_client(engine, settings) as client:
            first = asyncio.ensure_future(client.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": 30, "ignore_eos": True}))
            while engine.stats.kv_blocks_used < 2:  # the first request holds 2+ of 8
                await asyncio.sleep(0.01)
            second = await client.post("/v1/completions", json={"prompt": "Hi"})
            assert (await first).status_code == 200
            await wait_until_idle(engine)
            return second

    resp = asyncio.run(scenario())
    error = _check_error(resp, 503, "reject watermark")
    assert error["code"] == "kv_reject_watermark"
    assert int(resp.headers["retry-after"]) >= 1


def test_draining_server_refuses_with_503(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    engine.start_draining()

    async def scenario():
        async with asgi_client(engine, settings) as client:
            return await client.post("/v1/chat/completions", json=CHAT)

    resp = asyncio.run(scenario())
    assert _check_error(resp, 503, "shutting down")["code"] == "draining"
    assert int(resp.headers["retry-after"]) >= 1


def test_a_request_the_shutdown_cuts_is_503_with_retry_after(tiny_loaded):
    """The shutdown's grace ran out while a whole-body request ran: a 503 saying to retry
    on another replica, with Retry-After, as a refusal while draining has."""
    engine, spy, settings = make_engine(tiny_loaded, delay_s=0.02)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            pending = asyncio.ensure_future(client.post("/v1/completions", json={
                "prompt": "Hi", "max_tokens": 400, "ignore_eos": True}))
            while not spy.ran:  # it runs: the shutdown cuts it, it is not refused
                assert not pending.done(), pending.result().text
                await asyncio.sleep(0.01)
            engine.abort_all("shutdown")
            return await pending, (await client.get("/metrics")).text

    resp, metrics = asyncio.run(scenario())
    assert _check_error(resp, 503, "shutting down", "retry")["code"] == "server_shutdown"
    assert int(resp.headers["retry-after"]) >= 1
    # cut by the operator's shutdown, not failed by the engine: no engine-error alert fires
    assert requests_ended(metrics, "cancelled", "server_shutting_down") == 1
    assert requests_ended(metrics, "error", "server_shutting_down") == 0


def test_readyz_counts_refusals_by_reason(tiny_loaded):
    """/readyz's `rejections` counts the requests admission refused, by reason."""
    engine, _, settings = make_engine(tiny_loaded)
    engine.admission_paused = True

    async def scenario():
        async with asgi_client(engine, settings) as client:
            refused = [await client.post("/v1/completions", json={"prompt": "Hi"})
                       for _ in range(2)]
            return refused, await client.get("/readyz")

    refused, ready = asyncio.run(scenario())
    assert [r.status_code for r in refused] == [503, 503]
    assert ready.json()["rejections"] == {"admission_paused": 2}


def test_unexpected_error_is_an_openai_500_without_stack_trace(api, caplog):
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            state = client.app.state.serving

            def explode(prompt, add_special_tokens=True):
                raise RuntimeError("secret internals")

            state.encode_prompt = explode
            return await client.post("/v1/completions", json={"prompt": "Hi"})

    resp = asyncio.run(scenario())
    error = _check_error(resp, 500)
    assert error["type"] == "server_error"
    assert "secret internals" not in resp.text
    assert "secret internals" in caplog.text  # logged for the operator


def test_retry_after_is_the_wait_in_whole_seconds_rounded_up():
    """A refusal's Retry-After rounds its wait up: told 2 for a wait of 2.4 s, a client
    comes back before the server can take it; never less than 1."""
    def header(wait):
        decision = AdmissionDecision(False, "r", reason="queue_full", retry_after_s=wait)
        return rejection_error(decision, {}).headers["Retry-After"]

    assert [header(wait) for wait in (2.4, 2.0, 0.2, None)] == ["3", "2", "1", "1"]


def test_a_wrong_method_is_a_405_naming_the_methods_the_route_takes(api):
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.get("/v1/chat/completions")

    resp = asyncio.run(scenario())
    assert _check_error(resp, 405)["type"] == "invalid_request_error"
    assert resp.headers["allow"] == "POST"


def test_a_chat_without_max_tokens_gets_what_the_kv_pool_leaves(tiny_loaded):
    """No max_tokens: the rest of the context, and never more than the KV pool holds (here
    8 blocks of 16 tokens, under the model's 512): served, not refused as too long."""
    engine, _, settings = make_engine(tiny_loaded, num_kv_blocks=8)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            return await client.post("/v1/chat/completions", json=CHAT)

    resp = asyncio.run(scenario())
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["total_tokens"] <= 8 * 16
