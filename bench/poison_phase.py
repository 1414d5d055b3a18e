"""hostile_traffic's poison phase: innocent requests beside a stream of malformed ones
(bench/poison_requests.py), against phases without it, A B A B ... in one run.

Innocents: streamed completions, greedy (even ones) or sampled with a fixed seed (odd ones),
some with valid stop_token_ids and logit_bias, a few in flight at a time. Each ends in an
outcome: status, finish_reason and its tokens (logprobs' per-token strings: the API gives
no ids). The first A phase is the reference; an innocent of a B phase whose outcome differs
from its reference is disturbed (goal 0). An A phase that differs from the first says the
comparison itself is noisy (`baseline_unstable`, expected 0).

Poison: a child process (its CPU and event loop are not the innocents' client's) keeps
`concurrency` connections sending the kinds in turn, as the tenant "poison" or as an
innocent's, while a B phase's innocents run, paced to `poison_ratio` x the innocents'
request rate of the A phase before (1: one malformed request for each real one; 0: a flood,
each connection sending as soon as it is answered). Counted: each answer's status by kind; 5xx to
anyone (goal 0); answers outside a case's expected statuses, no answer, a hang, or a header
injected into the answer (each one failure, with its request); the slowest answers.
Timing: each phase's innocent p99 TPOT (ms), as the client saw it (first to last token over
the tokens between) and as the server timed it (timing.tpot_s); the medians and spreads
[min, max] of the A, B and C phases (C: ordinary requests, sent the same way at the same
rate), and B / C (goal: within 10%; printed, not checked), B / A and C / A.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.poison_requests import BENIGN, Poison, all_poison, send

PROMPTS = ["Tell me about the history of computing", "Once upon a time, in a quiet town",
           "The capital cities of Europe are", "def fibonacci(n):"]
POISON_TIMEOUT_S = 60.0  # no answer by then: a hang, one failure


@dataclass(frozen=True)
class Outcome:
    """How one innocent request ended: what must not change under poison."""

    status: int | str
    finish_reason: str | None = None
    tokens: tuple[str, ...] = ()
    tpot_s: float | None = field(default=None, compare=False)  # timing: never compared
    server_tpot_s: float | None = field(default=None, compare=False)  # the server's own


def innocent_body(i: int, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": f"{PROMPTS[i % len(PROMPTS)]} ({i})", "max_tokens": max_tokens,
            "stream": True, "logprobs": 0, "seed": i,
            "temperature": 0.0 if i % 2 == 0 else 0.9}
    if i % 3 == 1:  # the id fields the poison spoils, with valid values
        body.update(stop_token_ids=[7], logit_bias={"5": 2.0, "11": -5.0})
    return body


async def innocent(client: httpx.AsyncClient, i: int, max_tokens: int) -> Outcome:
    """One innocent streamed completion -> its outcome, with its client-side TPOT."""
    headers = {"X-Tenant": f"innocent-{i % 4}"}
    tokens: list[str] = []
    times: list[float] = []
    finish = server_tpot = None
    try:
        async with client.stream("POST", "/v1/completions", headers=headers,
                                 json=innocent_body(i, max_tokens)) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return Outcome(reply.status_code)
            async for line in reply.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                server_tpot = ((chunk.get("batchpilot") or {}).get("timing") or {}).get(
                    "tpot_s", server_tpot)
                for choice in chunk.get("choices", []):
                    new = (choice.get("logprobs") or {}).get("tokens") or []
                    tokens += new
                    times += [time.perf_counter()] * bool(new)
                    finish = choice.get("finish_reason") or finish
    except httpx.TransportError as exc:
        return Outcome(f"connection_error ({type(exc).__name__})")
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return Outcome(200, finish, tuple(tokens), tpot, server_tpot)


async def innocents(client: httpx.AsyncClient, n: int, concurrency: int, max_tokens: int,
                    min_s: float) -> list[tuple[int, Outcome]]:
    """Innocents 0..n-1, `concurrency` in flight, again and again until `min_s` seconds
    have passed (at least once) -> (index, outcome) of each."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[int, Outcome]:
        async with gate:
            return i, await innocent(client, i, max_tokens)

    outcomes: list[tuple[int, Outcome]] = []
    deadline = time.monotonic() + min_s
    while not outcomes or time.monotonic() < deadline:
        outcomes += await asyncio.gather(*(one(i) for i in range(n)))
    return outcomes


@dataclass
class PoisonStats:
    by_kind: dict[str, Counter] = field(default_factory=dict)  # kind -> status -> count
    failures: dict[tuple, dict] = field(default_factory=dict)
    slowest: list[tuple[float, str, str, str]] = field(default_factory=list)

    def record(self, poison: Poison, status: int | str, answer: bytes, seconds: float) -> None:
        self.by_kind.setdefault(poison.kind, Counter())[str(status)] += 1
        self.slowest = sorted([*self.slowest, (seconds, poison.kind, poison.name,
                                               str(status))], reverse=True)[:5]
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        problem = ("header injected into the answer" if b"\r\nx-injected:" in head
                   else None if status in poison.expect else f"expected {_ranges(poison)}")
        if problem is None:
            return
        failure = self.failures.setdefault((poison.kind, poison.name, str(status)), {
            "kind": poison.kind, "case": poison.name, "status": status, "problem": problem,
            "count": 0, "path": poison.path, "headers": repr(poison.headers)[:200],
            "body": poison.body[:300].decode("utf-8", "replace"),
            "answer": answer.split(b"\r\n\r\n", 1)[-1][:300].decode("utf-8", "replace")})
        failure["count"] += 1

    def merge(self, other: PoisonStats) -> None:
        for kind, counts in other.by_kind.items():
            self.by_kind.setdefault(kind, Counter()).update(counts)
        for key, failure in other.failures.items():
            self.failures.setdefault(key, {**failure, "count": 0})["count"] += failure["count"]
        self.slowest = sorted(self.slowest + other.slowest, reverse=True)[:5]


def _ranges(poison: Poison) -> str:
    return "413" if poison.expect == {413} else "4xx or 200" if 200 in poison.expect else "4xx"


async def poison_stream(url: str, stats: PoisonStats, stop: Any, concurrency: int,
                        kinds: tuple[str, ...] = (), rps: float = 0.0) -> None:
    """Until `stop` is set: each of `concurrency` senders takes the next case, `kinds` (all
    when empty) in turn, as the tenant "poison" or as an innocent's; `rps` > 0 paces all of
    them together to that many requests a second (0: each sends as soon as answered)."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    queues = list(all_poison(kinds).values())
    turn = 0
    next_at = time.monotonic()

    async def paced() -> None:
        nonlocal next_at
        if rps > 0:
            now = time.monotonic()
            wait, next_at = next_at - now, max(now, next_at) + 1.0 / rps
            if wait > 0:
                await asyncio.sleep(wait)

    async def sender() -> None:
        nonlocal turn
        while not stop.is_set():
            await paced()
            cases = queues[turn % len(queues)]
            poison = cases[(turn // len(queues)) % len(cases)]
            tenant = b"poison" if turn % 2 else b"innocent-%d" % (turn % 4)
            turn += 1
            started = time.perf_counter()
            status, answer = await send(poison, host, int(port), tenant, POISON_TIMEOUT_S)
            stats.record(poison, status, answer, time.perf_counter() - started)

    await asyncio.gather(*(sender() for _ in range(concurrency)))


def _poison_process(url: str, concurrency: int, kinds: tuple[str, ...], rps: float,
                    stop: Any, conn: Any) -> None:
    """The poison stream in its own process (its event loop and CPU time are not the
    innocents' client's), until `stop`; sends "ready", then its PoisonStats."""
    stats = PoisonStats()
    conn.send("ready")
    asyncio.run(poison_stream(url, stats, stop, concurrency, kinds, rps))
    conn.send(stats)


async def poisoned(url: str, concurrency: int, kinds: tuple[str, ...], rps: float,
                   stats: PoisonStats, during: Any) -> Any:
    """Await `during` (a coroutine) while a child process sends poison (`rps` a second, 0:
    unpaced); its counts merged into `stats`."""
    context = multiprocessing.get_context("spawn")
    stop, (ours, theirs) = context.Event(), context.Pipe()
    child = context.Process(target=_poison_process,
                            args=(url, concurrency, kinds, rps, stop, theirs), daemon=True)
    child.start()
    theirs.close()  # the child's end: should the child die, recv() raises, never hangs
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, ours.recv)  # poison is on its way before the innocents
    try:
        return await during
    finally:
        stop.set()
        stats.merge(await loop.run_in_executor(None, ours.recv))
        child.join(30)


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def run_poison_phase(client: httpx.AsyncClient, url: str, *, rounds: int, n: int,
                           concurrency: int, max_tokens: int, poison_concurrency: int,
                           phase_s: float, kinds: tuple[str, ...] = (),
                           poison_ratio: float = 1.0) -> dict[str, Any]:
    """`rounds` x (A: innocents alone, B: innocents beside the poison stream), each phase
    at least `phase_s` seconds of innocents. The poison's rate is `poison_ratio` x the
    innocents' request rate of the A phase before (0: a flood, as fast as answered)."""
    stats, control = PoisonStats(), PoisonStats()
    rates: list[float] = []  # poison requests a second, per B phase
    innocent_rate = 0.0  # the last A phase's innocent requests a second
    reference: dict[int, Outcome] = {}
    tpot = {side: {"A": [], "B": [], "C": []} for side in ("client", "server")}  # p99 ms
    disturbed: list[dict] = []
    unstable = innocent_5xx = innocents_sent = 0
    for round_ in range(rounds):
        for phase in ("A", "B", "C"):
            run = innocents(client, n, concurrency, max_tokens, phase_s)
            started = time.monotonic()
            if phase == "A":
                outcomes = await run
                innocent_rate = len(outcomes) / (time.monotonic() - started)
            elif phase == "B":
                rates.append(poison_ratio * innocent_rate)
                outcomes = await poisoned(url, poison_concurrency, kinds, rates[-1], stats,
                                          run)
            else:  # the control: ordinary requests at the poison's rate, sent the same way
                outcomes = await poisoned(url, poison_concurrency, (BENIGN,), rates[-1],
                                          control, run)
            innocents_sent += len(outcomes)
            innocent_5xx += sum(isinstance(o.status, int) and o.status >= 500
                                for _, o in outcomes)
            for side, values in (("client", [o.tpot_s for _, o in outcomes]),
                                 ("server", [o.server_tpot_s for _, o in outcomes])):
                if values := [v for v in values if v is not None]:
                    tpot[side][phase].append(p99(values) * 1e3)
            for i, got in outcomes:
                want = reference.setdefault(i, got)  # the first A phase's first outcome
                if got == want:
                    continue
                if phase != "B":
                    unstable += 1
                else:  # every one counted; the report shows the first few
                    disturbed.append({"round": round_, "innocent": i, "body": innocent_body(
                        i, max_tokens), "reference": _brief(want), "got": _brief(got)})
    return {"rounds": rounds, "innocent_set": n, "phase_s": phase_s,
            "innocents": innocents_sent, "poison_ratio": poison_ratio,
            "poison_rps": [round(r, 1) for r in rates],
            "poison_cases": {kind: len(cases) for kind, cases in all_poison(kinds).items()},
            "control_sent": sum(sum(c.values()) for c in control.by_kind.values()),
            "control_failures": sum(f["count"] for f in control.failures.values()),
            **summary(stats, tpot, disturbed, unstable, innocent_5xx)}


def _brief(outcome: Outcome) -> dict[str, Any]:
    return {"status": outcome.status, "finish_reason": outcome.finish_reason,
            "tokens": len(outcome.tokens), "text": "".join(outcome.tokens)[:80]}


def _timing(by_phase: dict[str, list[float]]) -> dict[str, Any]:
    """Per-phase p99s (ms) -> medians, spreads [min, max] and B / A of the medians."""
    median = {p: round(statistics.median(v), 3) if v else None for p, v in by_phase.items()}
    return {"phases": {p: [round(x, 3) for x in v] for p, v in by_phase.items()},
            "median": median,
            "spread": {p: [round(min(v), 3), round(max(v), 3)] if v else None
                       for p, v in by_phase.items()},
            "b_over_a": _ratio(median["B"], median["A"]),
            "c_over_a": _ratio(median["C"], median["A"]),
            "b_over_c": _ratio(median["B"], median["C"])}


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 3) if top and bottom else None


def summary(stats: PoisonStats, tpot: dict[str, dict[str, list[float]]],
            disturbed: list[dict], unstable: int, innocent_5xx: int) -> dict[str, Any]:
    poison_5xx = sum(count for kinds in stats.by_kind.values()
                     for status, count in kinds.items() if status.isdigit()
                     and int(status) >= 500)
    return {
        "poison_sent": sum(sum(c.values()) for c in stats.by_kind.values()),
        "poison_by_kind": {k: dict(sorted(c.items())) for k, c in stats.by_kind.items()},
        "five_xx": poison_5xx + innocent_5xx, "innocent_5xx": innocent_5xx,
        "innocents_disturbed": len(disturbed), "baseline_unstable": unstable,
        "poison_failures": sum(f["count"] for f in stats.failures.values()),
        "failures": list(stats.failures.values()), "disturbed": disturbed[:10],
        "slowest_poison": [{"seconds": round(s, 3), "kind": k, "case": c, "status": st}
                           for s, k, c, st in stats.slowest],
        # innocents' p99 TPOT, ms: as their client saw it, and as the server timed it
        "tpot_p99_ms": {side: _timing(by_phase) for side, by_phase in tpot.items()}}
