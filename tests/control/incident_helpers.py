"""A scripted incident on a live tiny-model server with a scheduler trace, for testing
postmortem and runbook tooling against a known story.

    with scripted_incident(tiny_loaded, tmp_path) as incident:
        incident.url       # the live server, until the block ends or incident.stop()
        incident.trace_db  # held by that server: use --url, or stop() first for --db
        incident.bad_version, incident.bad_diff, incident.phases[1].start, ...
    # here the server has stopped and the trace file is free

The story (WORKERS clients in a closed loop: each sends its next request when the last
one ends, so the queue never grows without bound and latency settles in each phase):

1. normal load under the starting config (version 1: max_num_seqs 128);
2. under load, PATCH /control/config {max_num_seqs: 1, max_num_batched_tokens: 16},
   reason "tune for batch" (version 2): one request runs at a time and each waits on
   max_num_seqs for the WORKERS - 1 ahead of it, so queue delay and TTFT go from ~10 ms to
   a few hundred; midway a burst of too-long requests is rejected (reason too_long);
3. under load, POST /control/rollback/1, reason "restore batching" (version 3): latency
   comes back to phase 1's.

Every step sleeps `step_delay_s` (make_engine's delay_s) so that a queued request waits a
measurable time. About 12 s of load; ~20 s in all on 2 cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving_helpers import LiveServer, make_engine

from control.settings import ServeSettings

WORKERS = 4
BAD_CHANGE = {"max_num_seqs": 1, "max_num_batched_tokens": 16}
BAD_REASON = "tune for batch"
ROLLBACK_REASON = "restore batching"
PHASE_REQUESTS = 16  # answered requests each phase needs at least (sent in it)
PHASE_CAP_S = 60.0


@dataclass(frozen=True)
class Phase:
    """One phase of the incident: [start, end) in epoch seconds (the server's clock), and
    the requests sent in it that completed (their ids are the trace's request ids)."""

    name: str
    start: float
    end: float
    request_ids: tuple[str, ...]


@dataclass
class Incident:
    """What `scripted_incident` did; `phases` are normal, bad config, after rollback."""

    url: str
    trace_db: str
    good_version: int  # the config before the bad change (1)
    bad_version: int  # the bad change (2)
    rollback_version: int  # the rollback to good_version (3)
    bad_diff: dict[str, list[Any]]  # as recorded: {"max_num_seqs": [128, 1], ...}
    phases: tuple[Phase, Phase, Phase]
    rejected: int  # too-long requests rejected in phase 2
    server: LiveServer = field(repr=False)

    @property
    def bad_time(self) -> float:
        return self.phases[1].start

    @property
    def rollback_time(self) -> float:
        return self.phases[2].start

    def stop(self) -> None:
        """Stop the server (idempotent): its trace writer commits and closes the file."""
        if self.server.thread.is_alive():
            self.server.__exit__(None, None, None)


@contextlib.contextmanager
def scripted_incident(loaded: Any, directory: Path, *, phase_s: float = 4.0,
                      step_delay_s: float = 0.005, max_tokens: int = 16,
                      rejected: int = 6, config: dict | None = None) -> Iterator[Incident]:
    """Run the incident (module docstring) on a live server over `loaded` (the
    `tiny_loaded` fixture), its trace at `directory`/trace.duckdb; yield the Incident with
    the server still running; stop the server when the block ends. `config`: a serving
    YAML as a dict (e.g. playbooks/serving.yaml, for its profiles); default: built in."""
    settings = ServeSettings(model="tiny", trace_db=str(Path(directory) / "trace.duckdb"))
    engine, _, settings = make_engine(loaded, delay_s=step_delay_s, settings=settings,
                                      config=config, tmp_path=Path(directory))
    server = LiveServer(engine, settings)
    url = server.__enter__()
    try:
        incident = asyncio.run(_script(url, settings.trace_db, server, phase_s, max_tokens,
                                       rejected))
        yield incident
    finally:
        if server.thread.is_alive():
            server.__exit__(None, None, None)


async def _script(url: str, trace_db: str, server: LiveServer, phase_s: float,
                  max_tokens: int, rejected: int) -> Incident:
    sent: list[tuple[float, str]] = []  # (send time, request id) of every 200
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        start = (await client.get("/control/config")).json()
        good = start["version"]

        async def worker(w: int) -> None:
            i = 0
            while not stop.is_set():
                t = time.time()
                reply = await client.post("/v1/completions", json={
                    "model": "tiny", "prompt": f"incident worker {w} request {i}",
                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
                assert reply.status_code == 200, reply.text
                sent.append((t, reply.json()["id"]))
                i += 1

        async def settle(since: float, min_s: float) -> None:
            """Wait min_s, then until PHASE_REQUESTS sent since `since` have answered: a
            slow machine gets a longer phase, never a phase too thin for the report to
            judge (it needs 10 requests a side)."""
            await asyncio.sleep(min_s)
            deadline = time.time() + PHASE_CAP_S
            while sum(t >= since for t, _ in sent) < PHASE_REQUESTS:
                assert time.time() < deadline, f"phase from {since}: too few requests"
                await asyncio.sleep(0.05)

        t0 = time.time()
        load = [asyncio.create_task(worker(w)) for w in range(WORKERS)]
        await settle(t0, phase_s)
        t_bad = time.time()
        bad = await client.patch("/control/config", headers={"If-Match": str(good)},
                                 json={"changes": BAD_CHANGE, "reason": BAD_REASON})
        assert bad.status_code == 200, bad.text
        await asyncio.sleep(phase_s / 2)
        too_long = await asyncio.gather(*(client.post("/v1/completions", json={
            "model": "tiny", "prompt": "far too long", "max_tokens": 1_000_000})
            for _ in range(rejected)))
        assert all(r.status_code == 400 for r in too_long), [r.text for r in too_long]
        await settle(t_bad, phase_s / 2)
        t_back = time.time()
        back = await client.post(f"/control/rollback/{good}", json={"reason": ROLLBACK_REASON},
                                 headers={"If-Match": str(bad.json()["version"])})
        assert back.status_code == 200, back.text
        await settle(t_back, phase_s)
        stop.set()
        await asyncio.gather(*load)
        t_end = time.time()
        history = (await client.get("/control/history")).json()["versions"]
    times = {v["version"]: v["time"] for v in history}
    bad_v, back_v = bad.json()["version"], back.json()["version"]
    edges = [t0, times[bad_v], times[back_v], t_end]
    phases = tuple(Phase(name, lo, hi, tuple(rid for t, rid in sent if lo <= t < hi))
                   for name, lo, hi in zip(("normal", "bad config", "rolled back"),
                                           edges, edges[1:], strict=False))
    return Incident(url, trace_db, good, bad_v, back_v, bad.json()["diff"],
                    phases, rejected, server)  # type: ignore[arg-type]
