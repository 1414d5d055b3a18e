"""The delay after the server's own latency stamps: measured, so it is not hidden.

The engine stamps a token's time when the step that sampled it returns (ttft_s and the
inter-token times count to there). The client gets it later: the engine thread still
records the step (metrics, trace queue), detokenizes, and hands the events to the event
loop, which must wake (it shares the GIL with the engine, trace and metrics threads),
format the chunk and write it to the socket. Two histograms say how long that takes:

    batchpilot_response_delivery_seconds{kind}  step returned -> bytes handed to the
        transport; kind: first_token | token (streams) | response (whole JSON bodies)
    batchpilot_event_loop_lag_seconds            how late a 50 ms timer on the event loop
        fires: the wait any chunk, body parse or probe answer has before it runs

A client-side reconciliation (`batchpilot loadtest`'s TTFT/E2E gap) measures the same
delay from the outside, plus the network and the client's own loop.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

from control.serve.streams import StreamEvent

LAG_PROBE_S = 0.05  # the event-loop timer's period
DELIVERY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class DeliveryProbe:
    """Histograms on the server's registry; observed on the event loop only."""

    def __init__(self, registry: CollectorRegistry, model: str):
        self.model = model
        self.delivery = Histogram(
            "batchpilot_response_delivery_seconds", "From the engine step that produced"
            " a token (or a request's end) to its bytes handed to the HTTP transport.",
            ("model", "kind"), buckets=DELIVERY_BUCKETS, registry=registry)
        self.loop_lag = Histogram(
            "batchpilot_event_loop_lag_seconds", f"How late a {LAG_PROBE_S * 1000:g} ms"
            " timer on the server's event loop fires.", ("model",),
            buckets=DELIVERY_BUCKETS, registry=registry)
        # every series from the first scrape; kept: .labels() (a lock, a key, a lookup)
        # per streamed token made an observation 1.9 us where the kept series take 1.2
        self._series = {kind: self.delivery.labels(model, kind)
                        for kind in ("first_token", "token", "response")}
        self.loop_lag.labels(model)

    def delivered(self, event: StreamEvent, kind: str) -> None:
        """`event`'s bytes were just handed to the transport."""
        if event.step_done:
            series = self._series.get(kind) or self.delivery.labels(self.model, kind)
            series.observe(max(0.0, time.perf_counter() - event.step_done))

    async def watch_event_loop(self) -> None:
        """Runs for the server's life: one timer every LAG_PROBE_S, its lateness observed."""
        lag = self.loop_lag.labels(self.model)
        while True:
            due = time.perf_counter() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            lag.observe(max(0.0, time.perf_counter() - due))
