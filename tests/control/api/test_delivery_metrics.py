"""Issue 22, item 2: the way from the engine step to the client is measured, not hidden.

/metrics carries how long a step's tokens take to reach the transport (first token,
later tokens, whole bodies) and how late the event loop runs its timers.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.delivery import DeliveryProbe
from control.serve.streams import StreamEvent


def _count(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf'^{name}_count\{{[^}}]*{re.escape(want)}[^}}]*\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no {name}_count with {labels}"
    return float(match.group(1))


def test_stream_and_body_deliveries_are_observed(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario() -> tuple[int, str]:
        async with asgi_client(engine, settings) as client:
            request = {"prompt": "The scheduler", "max_tokens": 16, "ignore_eos": True}
            async with client.stream("POST", "/v1/completions",
                                     json={**request, "stream": True}) as resp:
                assert resp.status_code == 200
                body = (await resp.aread()).decode()
            plain = await client.post("/v1/completions", json=request)
            assert plain.status_code == 200
            return body.count('"text":"') - body.count('"text":""'), \
                (await client.get("/metrics")).text

    chunks, text = asyncio.run(scenario())
    name = "batchpilot_response_delivery_seconds"
    # one observation per content chunk sent (the tiny random model's tokens may decode to
    # no text: such a token sends no chunk)
    assert _count(text, name, kind="first_token") == min(chunks, 1)
    assert _count(text, name, kind="token") == max(chunks - 1, 0)
    assert _count(text, name, kind="response") == 1


def test_event_loop_lag_is_observed_and_counts_a_blocked_loop():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    probe = DeliveryProbe(registry, "m")

    async def scenario() -> None:
        task = asyncio.ensure_future(probe.watch_event_loop())
        await asyncio.sleep(0.12)
        import time
        time.sleep(0.2)  # something holds the loop: the next timer fires ~0.2 s late
        await asyncio.sleep(0.12)
        task.cancel()

    asyncio.run(scenario())
    lag_sum = registry.get_sample_value("batchpilot_event_loop_lag_seconds_sum", {"model": "m"})
    count = registry.get_sample_value("batchpilot_event_loop_lag_seconds_count", {"model": "m"})
    assert count >= 3 and lag_sum >= 0.1, (count, lag_sum)


def test_a_timer_that_fires_on_time_has_no_lag(monkeypatch):
    """The lag is how late a timer fires past its due time, not the period it waited: on
    a clock where two timers fire on time and one 20 ms late, the lags sum to 20 ms."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from control.api import delivery

    now, fired = [100.0], []

    class Stop(Exception):
        """Ends the lag watcher's loop after its third timer (the fake sleep raises it)."""

    async def sleep(seconds: float) -> None:
        if len(fired) == 3:
            raise Stop
        fired.append(seconds)
        now[0] += seconds + (0.02 if len(fired) == 2 else 0.0)

    monkeypatch.setattr(delivery, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(delivery, "asyncio", SimpleNamespace(sleep=sleep))
    registry = CollectorRegistry()
    probe = DeliveryProbe(registry, "m")
    with pytest.raises(Stop):
        asyncio.run(probe.watch_event_loop())
    labels = {"model": "m"}
    assert registry.get_sample_value("batchpilot_event_loop_lag_seconds_count", labels) == 3
    assert registry.get_sample_value("batchpilot_event_loop_lag_seconds_sum",
                                     labels) == pytest.approx(0.02)
    on_time = registry.get_sample_value("batchpilot_event_loop_lag_seconds_bucket",
                                        {**labels, "le": "0.0005"})
    assert on_time == 2


def test_an_event_not_from_a_step_is_not_observed():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    probe = DeliveryProbe(registry, "m")
    probe.delivered(StreamEvent("r", "", (), 0, finished=True), "response")
    assert registry.get_sample_value("batchpilot_response_delivery_seconds_count",
                                     {"model": "m", "kind": "response"}) == 0
