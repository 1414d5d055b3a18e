"""A failing engine step on a live server (issue 17, item 9): the failing request's stream
ends with an OpenAI-shaped error, a concurrent one completes, the KV returns to 0, the
failure is counted by reason, and /readyz turns 503 only while steps keep failing."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from fixtures.serving import (
    LiveServer,
    asgi_client,
    kv_in_use,
    make_engine,
    sse_events,
    wait_until_idle,
)

from engine.records import SchedulerOutput
from engine.sim.faults import Fault, FaultyExecutor

POISON = {"X-Tenant": "poison"}
FAILED_ERROR = ("the engine failed while running this request (step failed: execute raised"
                " InjectedFault) and ended it; the server log has why")


class CallLog:
    """Outermost wrapper: (step id, batch size) of every executor call, failed ones too."""

    def __init__(self, inner: FaultyExecutor):
        self.inner, self.calls = inner, []

    def execute(self, out: SchedulerOutput) -> list[int]:
        self.calls.append((out.step_id, out.num_seqs))
        return self.inner.execute(out)


async def _inject(engine, *faults: Fault) -> CallLog:
    def swap(e):
        e.executor = CallLog(FaultyExecutor(e.executor, *faults))
        return e.executor
    return await engine.call(swap)


def _requests_total(text: str, outcome: str, reason: str) -> float:
    key = f'outcome="{outcome}",reason="{reason}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("batchpilot_requests_total{") and key in line)


def test_a_failing_request_ends_alone_and_the_server_stays_ready(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.01)
    body = {"prompt": "The scheduler", "max_tokens": 40, "ignore_eos": True, "stream": True}

    async def scenario():
        async with asgi_client(engine, settings) as client:
            calls = await _inject(engine, Fault(match=lambda r: r.tenant == "poison",
                                                prefill_only=True))
            good = asyncio.ensure_future(client.post("/v1/completions", json=body))
            deadline = time.monotonic() + 30
            while engine.stats.running == 0 or engine.stats.steps < 5:
                assert time.monotonic() < deadline, "the good stream never started"
                await asyncio.sleep(0.01)  # the good stream is decoding
            bad = await client.post("/v1/completions", json=body, headers=POISON)
            plain = await client.post("/v1/completions", headers=POISON, json={
                **body, "stream": False})
            good = await asyncio.wait_for(good, 30)
            await wait_until_idle(engine)
            used = await kv_in_use(engine)
            return (good, bad, plain, used, calls.calls, (await client.get("/readyz")),
                    (await client.get("/metrics")).text)

    good, bad, plain, used, calls, ready, metrics = asyncio.run(scenario())
    good_final = sse_events(good.text.splitlines())[-2]
    assert good_final["choices"][0]["finish_reason"] == "length"
    assert good_final["batchpilot"]["usage"]["completion_tokens"] == 40
    final = sse_events(bad.text.splitlines())[-2]
    assert final["choices"][0]["finish_reason"] == "error"
    assert final["error"] == {"message": FAILED_ERROR, "type": "server_error", "param": None,
                              "code": "engine_error"}
    assert final["batchpilot"]["finish_detail"] == "step failed: execute raised InjectedFault"
    assert "Traceback" not in bad.text and "injected fault" not in bad.text
    assert plain.status_code == 500 and plain.json()["error"]["message"] == FAILED_ERROR
    # the poison prompt ran next to the good stream: the step was bisected, not ended whole
    step = next(s for s, n in calls if n == 2 and (s, 1) in calls)
    assert [n for s, n in calls if s == step] == [2, 1, 1]
    assert used == 0
    assert _requests_total(metrics, "error", "step_failed") == 2
    assert ready.status_code == 200
    assert ready.json()["step_failures"]["failed_requests"] == 2


def test_readyz_is_503_while_steps_keep_failing_and_200_after_a_good_step(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    body = {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await _inject(engine, Fault(match=lambda r: r.tenant == "poison"))
            probes = []
            for _ in range(3):
                failed = await client.post("/v1/completions", json=body, headers=POISON)
                assert failed.status_code == 500
                probes.append(await client.get("/readyz"))
            ok = await client.post("/v1/completions", json=body)
            await wait_until_idle(engine)
            return probes, ok, await client.get("/readyz"), await kv_in_use(engine)

    probes, ok, after, used = asyncio.run(scenario())
    assert [p.status_code for p in probes] == [200, 200, 503]
    unready = probes[-1].json()
    assert unready["reason"].startswith("the last 3 engine steps failed (latest ")
    assert "step failed: execute raised InjectedFault" in unready["reason"]
    assert probes[-1].headers["Retry-After"] == "5"
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    assert after.status_code == 200 and after.json()["reason"] is None
    assert after.json()["step_failures"]["consecutive"] == 0
    assert after.json()["step_failures"]["failed_steps"] == 3
    assert used == 0


def _last_row_finishes(out: SchedulerOutput) -> bool:
    """An earlier sample row takes its last token in this step (update() finishes it)."""
    rows = out.sample_requests()
    return len(rows) >= 2 and any(
        r.num_output_tokens + 1 >= r.sampling_params.max_tokens for r in rows[:-1])


def test_an_update_failure_after_a_request_finished_keeps_the_loop_alive(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.005)
    stream = {"prompt": "The scheduler", "ignore_eos": True, "stream": True}

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await _inject(engine, Fault(when=_last_row_finishes, mode="corrupt", times=1))
            first = asyncio.ensure_future(client.post("/v1/completions", json={
                **stream, "max_tokens": 20}))
            await asyncio.sleep(0.02)
            second = await client.post("/v1/completions", json={**stream, "max_tokens": 60})
            first = await asyncio.wait_for(first, 30)
            after = await asyncio.wait_for(client.post("/v1/completions", json={
                "prompt": "Hi", "max_tokens": 3, "ignore_eos": True}), 30)
            await wait_until_idle(engine)
            return first, second, after, await kv_in_use(engine), await client.get("/readyz")

    first, second, after, used, ready = asyncio.run(scenario())
    for resp in (first, second):  # the step's whole batch: update() failed part-way
        final = sse_events(resp.text.splitlines())[-2]
        assert final["choices"][0]["finish_reason"] == "error"
        assert final["batchpilot"]["finish_detail"] == "step failed: update raised InjectedFault"
    assert after.status_code == 200 and after.json()["choices"][0]["finish_reason"] == "length"
    assert used == 0
    assert ready.status_code == 200


def test_over_a_socket_a_concurrent_stream_outlives_a_failed_step(tiny_loaded):
    # uvicorn in a thread: the same story over a real socket.
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.01)
    body = {"prompt": "The scheduler", "max_tokens": 40, "ignore_eos": True, "stream": True}
    good: list[str] = []
    with LiveServer(engine, settings) as url:
        faulty = FaultyExecutor(engine.parts.engine.executor,
                                Fault(match=lambda r: r.tenant == "poison"))
        asyncio.run(engine.call(lambda e: setattr(e, "executor", faulty)))

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
                good.extend(r.iter_lines())
        thread = threading.Thread(target=stream)
        thread.start()
        deadline = time.monotonic() + 30
        while engine.stats.running == 0 or engine.stats.steps < 5:
            assert time.monotonic() < deadline, "the good stream never started"
            time.sleep(0.01)
        failed = httpx.post(url + "/v1/completions", json={**body, "stream": False},
                            headers=POISON, timeout=30)
        thread.join(30)
        ready = httpx.get(url + "/readyz", timeout=30)
    assert sse_events(good)[-2]["choices"][0]["finish_reason"] == "length"
    assert failed.status_code == 500 and failed.json()["error"]["message"] == FAILED_ERROR
    assert faulty.fired and ready.status_code == 200


@pytest.mark.parametrize(("whole", "ready"), [(True, False), (False, True)])
def test_step_health_rule(whole, ready):
    from control.serve.step_health import StepHealth

    now = [100.0]
    health = StepHealth(unready_after=3, hold_s=30.0, clock=lambda: now[0])

    class Failure:
        step_id, whole_step = 7, whole

    for _ in range(3):
        health.on_failure(Failure(), "step failed: execute raised OutOfMemoryError", 1)
    assert (health.reason() is None) == ready  # a step in which some requests ran resets it
    now[0] += 29.9
    assert (health.reason() is None) == ready
    now[0] += 0.2  # 30 s without a failure: ready again, to take traffic and prove itself
    assert health.reason() is None
    health.on_failure(Failure(), "step failed: execute raised OutOfMemoryError", 1)
    assert (health.reason() is None) == ready  # still a run of 4 whole-step failures
    health.on_success()
    assert health.reason() is None
    with pytest.raises(ValueError, match="unready_after"):
        StepHealth(unready_after=0)


def test_a_step_in_which_some_requests_ran_ends_a_run_of_whole_failures():
    """Two whole-step failures, one that ended only part of its batch, one whole again: the
    run is 1, not 3 (part of the batch ran, so the engine works): still ready."""
    from control.serve.step_health import StepHealth

    health = StepHealth(unready_after=3, hold_s=30.0, clock=lambda: 100.0)

    class Failure:
        step_id = 7

        def __init__(self, whole_step: bool):
            self.whole_step = whole_step

    for whole in (True, True, False, True):
        health.on_failure(Failure(whole), "step failed: execute raised InjectedFault", 1)
    assert health.consecutive == 1 and health.reason() is None


def test_readyz_counts_every_request_a_failed_step_ended():
    """`failed_requests` counts requests, not steps: one step that ended three is 3."""
    import logging

    from control.serve.step_health import StepHealth

    class Failure:
        step_id, whole_step, phase, num_succeeded = 4, True, "execute", 0
        request_ids = ["a", "b", "c"]
        detail, error = "step failed: execute raised InjectedFault", RuntimeError("boom")

    health = StepHealth(clock=lambda: 100.0)
    health.step_failed(Failure(), logging.getLogger("test.step_health"))
    assert health.as_dict()["failed_requests"] == 3
    assert health.as_dict()["failed_steps"] == 1


def test_a_new_kind_of_failure_logs_its_traceback_at_once(caplog):
    """Alike failures log one traceback per TRACEBACK_EVERY_S, but a different one (another
    exception) logs its own traceback at once: the log shows why it failed this time."""
    import logging

    from control.serve.step_health import StepHealth

    now = [100.0]
    health = StepHealth(clock=lambda: now[0])
    log = logging.getLogger("test.step_health")
    tracebacks = []
    for detail in ("raised OutOfMemoryError", "raised OutOfMemoryError", "raised KeyError"):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="test.step_health"):
            health.on_failure(None, detail, 1)
            health.log(log, RuntimeError(detail), f"step failed: {detail}")
        tracebacks.append(caplog.records[-1].exc_info is not None)
        now[0] += 1.0
    assert tracebacks == [True, False, True]
