"""Send a planned workload to a server and time what each client sees.

Each request is sent at its planned arrival time (open loop), unless `concurrency`
requests are already in flight: then it waits client-side, as a real client pool would.
Streaming requests record the time of every content chunk; a request with
`cancel_after_s` closes its connection at that moment (the server aborts it). A
non-streaming response carries no per-token timing, so its TTFT is the server's own
(`batchpilot.timing.ttft_s` in the body) and it contributes no ITL. The server's own
`ttft_s` and `e2e_s` (the body's, or the last stream chunk's) are kept next to the
client's, to measure what the server does not see (metrics.ttft_gap_s, e2e_gap_s).
With `retries` (control/loadtest/retries.py, the OpenAI SDK's rule), a refused request is
sent again after its Retry-After, holding its place in the client pool meanwhile as an SDK
call does; its times count from the first send (what its user waits), and `sends` says
how many it took.
Streams to a server on this machine go over control/loadtest/local_streams.py, which
parses each reply after it ends (httpx's parsing per chunk would take a tenth of a 2-core
machine from the server); to other machines, over httpx's pooled connections. What is
sent and how a reply folds into a RequestResult: control/loadtest/wire.py.

    results, duration_s = asyncio.run(run(url, planned, prompts, model="smollm2-135m"))
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx

from control.loadtest import sse_transport
from control.loadtest.local_streams import LocalStreams, local_streams, stream_local
from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.retries import ClientRetries
from control.loadtest.wire import (
    body_for,
    headers_for,
    json_object,
    lane_slo,
    refused,
    stream_ended,
    take_event,
)

NO_RETRIES = ClientRetries()  # a refusal is final


async def run(url: str, planned: list[PlannedRequest], prompts: dict[int, str], *,
              model: str, concurrency: int = 64, timeout_s: float = 300.0,
              token: str | None = None,
              on_done: Callable[[RequestResult], None] | None = None,
              retries: ClientRetries = NO_RETRIES, seed: int = 0,
              local: bool | None = None) -> tuple[list[RequestResult], float]:
    """All results (in plan order) and the wall time from the first send to the last end.
    `local`: streams over sse_transport (True), over httpx (False); None: sse_transport
    when the server is on this machine."""
    limits = httpx.Limits(max_connections=concurrency + 4,
                          max_keepalive_connections=concurrency + 4)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    streams = local_streams(url, headers, timeout_s) if local is not False else None
    if local and streams is None:
        raise ValueError(f"{url} is not a plain-HTTP server on this machine")
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)  # the retries' jitter
    start = time.monotonic()
    # follow_redirects stays False (httpx's default, said here so it is not turned on): a
    # followed redirect would carry the token to wherever the 3xx points
    async with httpx.AsyncClient(base_url=url.rstrip("/"), limits=limits, headers=headers,
                                 timeout=httpx.Timeout(timeout_s, connect=30.0),
                                 follow_redirects=False) as client:
        async def one(p: PlannedRequest) -> RequestResult:
            await asyncio.sleep(max(0.0, start + p.arrival_s - time.monotonic()))
            async with gate:
                result = await send_until_final(client, p, prompts[p.index], model,
                                                timeout_s, retries, rng, streams)
            if on_done is not None:
                on_done(result)
            return result

        results = await asyncio.gather(*(one(p) for p in planned))
    sent = [r.sent_at for r in results if r.sent_at]
    ends = [r.sent_at + (r.e2e_s or 0.0) for r in results if r.sent_at]
    duration = (max(ends) - min(sent)) if sent else 0.0
    return list(results), duration


async def send_until_final(client: httpx.AsyncClient, p: PlannedRequest, prompt: str,
                           model: str, timeout_s: float, retries: ClientRetries,
                           rng: random.Random, streams: LocalStreams | None = None,
                           ) -> RequestResult:
    """Send `p`, and again while `retries` says a refusal is worth a wait; the last
    answer, timed from the first send."""
    sent_at, t0 = time.time(), time.monotonic()
    for sends in range(1, retries.retries + 2):
        result = await send(client, p, prompt, model, timeout_s, t0, resends=sends - 1,
                            streams=streams)
        result.sent_at = sent_at
        if result.outcome != "rejected" or result.http_status is None:
            return result
        delay = retries.delay_s(result.http_status, result.retry_after, sends, rng)
        if delay is None:
            return result
        await asyncio.sleep(delay)
    return result


async def send(client: httpx.AsyncClient, p: PlannedRequest, prompt: str, model: str,
               timeout_s: float, t0: float | None = None, resends: int = 0,
               streams: LocalStreams | None = None) -> RequestResult:
    """One send, after `resends` earlier ones; its times count from `t0`, when the first
    left (monotonic; default now). A stream goes over `streams` when given."""
    result = RequestResult(p, "error", sent_at=time.time(), sends=resends + 1)
    now = time.monotonic()
    t0 = now if t0 is None else t0
    if resends:  # this send left this long after the first
        result.last_send_s = now - t0
    if not p.stream:
        go = _whole(client, p, prompt, model, result, t0)
    elif streams is not None:
        go = stream_local(streams, p, prompt, model, result, t0)
    else:
        go = _stream(client, p, prompt, model, result, t0)
    try:
        if p.cancel_after_s is not None:
            await asyncio.wait_for(go, p.cancel_after_s)
        else:
            await go
    except TimeoutError:  # the client gives up: leaving the block closes the connection
        result.outcome = "cancelled"
        result.e2e_s = time.monotonic() - t0
    except (httpx.TimeoutException, sse_transport.ReplyTimeout):
        result.outcome, result.error = "timeout", f"no answer within {timeout_s:g} s"
        result.e2e_s = time.monotonic() - t0
    except (httpx.HTTPError, sse_transport.ReplyError, OSError, ValueError) as exc:
        result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}"
        result.e2e_s = time.monotonic() - t0
    return result


async def _whole(client, p, prompt, model, result: RequestResult, t0: float) -> None:
    reply = await client.post("/v1/completions", json=body_for(p, prompt, model),
                              headers=headers_for(p, result.sends - 1))
    result.e2e_s = time.monotonic() - t0
    result.http_status = reply.status_code
    result.request_id = reply.headers.get("x-batchpilot-request-id", "")
    data = json_object(reply.content)
    if reply.status_code != 200:
        refused(result, reply.status_code, reply.headers, data)
        return
    usage = data.get("usage") or {}
    result.prompt_tokens = usage.get("prompt_tokens", 0)
    result.output_tokens = usage.get("completion_tokens", 0)
    info = data.get("batchpilot") or {}
    lane_slo(result, info)
    timing = info.get("timing") or {}
    result.server_ttft_s = timing.get("ttft_s")
    if result.server_ttft_s is not None:  # the server's, from this send's arrival
        result.ttft_s = result.last_send_s + result.server_ttft_s
    result.server_e2e_s = timing.get("e2e_s")
    reason = (data.get("choices") or [{}])[0].get("finish_reason")
    result.outcome = "timeout" if reason == "timeout" else "ok"


async def _stream(client, p, prompt, model, result: RequestResult, t0: float) -> None:
    async with client.stream("POST", "/v1/completions", json=body_for(p, prompt, model),
                             headers=headers_for(p, result.sends - 1)) as reply:
        result.http_status = reply.status_code
        result.request_id = reply.headers.get("x-batchpilot-request-id", "")
        if reply.status_code != 200:
            refused(result, reply.status_code, reply.headers, json_object(await reply.aread()))
            result.e2e_s = time.monotonic() - t0
            return
        reason = None
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                reason = take_event(result, json_object(line[6:].encode()),
                                     time.monotonic() - t0, reason)
        stream_ended(result, time.monotonic() - t0, reason)


