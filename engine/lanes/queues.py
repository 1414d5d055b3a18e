"""Lane queues and weighted fair share of the token budget among them.

Fair share is start-time fair queueing on tokens: each lane keeps a virtual time that
grows by `tokens / weight` for every token its requests run, prefill and decode (charged
once a step, by `engine/scheduling/fair_share.py`; picks within the step count its tokens already).
The next new prefill comes from the lane with queued work whose virtual time is
smallest. A lane that starts queueing joins level with the lowest virtual time among the
lanes already queued (or with the one furthest ahead when none is), so time spent not
queueing earns no credit. Inside a lane with `tenant_fair_share`, tenants share the
lane's tokens the same way (equal weights).

Queues are heaps keyed by the lane's policy; entries of requests that finished while
queued (cancel, timeout) are skipped lazily when they reach the head. Per-tenant state
lives only while the tenant has a request queued or running (engine/lanes/tenants.py); queue
timeouts are found by time, not queue position (engine/lanes/queue_timeouts.py).
"""

from __future__ import annotations

import heapq
import itertools
import math

from engine.config import LaneConfig, LiveConfig
from engine.errors import SchedulerInvariantError
from engine.lanes.queue_timeouts import QueueTimeouts
from engine.lanes.tenants import TenantBook, add_count
from engine.request import Request, RequestStatus

_ALL_TENANTS = ""  # the single bucket of a lane without tenant fair share


def queue_key(policy: str, req: Request) -> tuple:
    """A request's place in its lane's queue, by the lane's policy. A deferred one (its
    TTFT target out of reach at admission: engine/lanes/admission.py) goes behind every
    one that is not, and among the deferred the shorter prompt first: they have missed
    their target already, so the order that serves the most of them before their queue
    timeout is the one that counts."""
    if policy == "priority":
        key: tuple = (req.priority,)
    elif policy == "deadline":
        key = (req.deadline if req.deadline is not None else math.inf,)
    else:
        key = ()
    if req.slo_deferred:
        return (True, *key, req.num_prompt_tokens, req.arrival_time, req.queue_seq)
    return (False, *key, req.arrival_time, req.queue_seq)


def join_vtime(own: float, queued: list[float], everyone: list[float]) -> float:
    """Virtual time of a lane (or tenant) that starts queueing: never behind the others.

    Level with the lowest of those already queued; when none is, level with the one
    furthest ahead, so that whoever queues next joins level with it.
    """
    floor = min(queued) if queued else max(everyone, default=own)
    return max(own, floor)


class LaneQueue:
    """One lane's waiting requests (by tenant bucket) and its fair-share accounting.

    Per-tenant state (buckets, `tenants`: counts and virtual times) exists only for
    tenants with a request queued or running here (engine/lanes/tenants.py): its size, and every
    per-step loop over it, follow the active tenants, never the history.
    """

    _seq = itertools.count()

    def __init__(self, config: LaneConfig):
        self.config = config
        self.name = config.name
        self.vtime = 0.0
        self.num_waiting = 0
        self.num_running = 0
        self.num_decoding = 0  # running requests past their prompt (1 token a step)
        self.waiting_tokens = 0  # tokens of the queued requests (all still to compute)
        self.num_deferred = 0  # queued requests admitted deferred (engine/lanes/admission.py)
        self.tenants = TenantBook()
        self.batch_closed = False  # static batching: the current batch takes no newcomers
        # bucket -> heap of (queue key, request); a bucket exists iff it has a queued
        # request (entries of requests that finished while queued are skipped lazily)
        self._buckets: dict[str, list[tuple]] = {}
        self.timeouts = QueueTimeouts()  # never-scheduled requests by arrival / deadline

    @property
    def has_work(self) -> bool:
        return self.num_waiting > 0 or self.num_running > 0

    def buckets(self) -> dict[str, list[tuple]]:
        """The queue's buckets (read-only: for checks)."""
        return self._buckets

    def bucket_name(self, req: Request) -> str:
        return req.tenant if self.config.tenant_fair_share else _ALL_TENANTS

    def push(self, req: Request) -> None:
        if not req.queue_seq:
            req.queue_seq = next(self._seq) + 1
        self.tenants.queued(req.tenant, self.config.tenant_fair_share)
        heapq.heappush(self._buckets.setdefault(self.bucket_name(req), []),
                       (queue_key(self.config.policy, req), req))
        self.num_waiting += 1
        self.num_deferred += req.slo_deferred
        self.waiting_tokens += req.num_tokens  # queued requests hold no KV yet
        self.timeouts.push(req)

    def peek(self, step_tokens: dict[str, int] | None = None) -> Request | None:
        """The request this lane would start next (fair among tenants), or None.

        `step_tokens`: tokens each tenant ran in the step being scheduled, not yet charged.
        """
        best, best_vtime = None, math.inf
        vtimes = self.tenants.vtimes
        for name, bucket in self._buckets.items():
            while bucket and bucket[0][1].status is not RequestStatus.WAITING and (
                    bucket[0][1].status is not RequestStatus.PREEMPTED):
                heapq.heappop(bucket)  # finished while queued
            if not bucket:
                continue
            vtime = vtimes.get(name, 0.0)
            if step_tokens:
                vtime += step_tokens.get(name, 0)
            if best is None or vtime < best_vtime:
                best, best_vtime = bucket[0][1], vtime
        return best

    def pop(self, req: Request) -> None:
        """Take `req` out of the queue to start it: it must be what peek() returned."""
        bucket = self._buckets.get(self.bucket_name(req))
        if not bucket or bucket[0][1] is not req:
            head = bucket[0][1].request_id if bucket else None
            raise SchedulerInvariantError(f"lane {self.name!r}: pop({req.request_id!r}) must"
                                          f" follow peek(), whose head is {head!r}")
        heapq.heappop(bucket)
        self._count_out(req, finished=False)

    def discard(self, req: Request) -> None:
        """Count `req` out of the queue: it finished while queued (its heap entry is skipped
        when it reaches the head, or dropped with its bucket)."""
        self._count_out(req, finished=True)

    def _count_out(self, req: Request, *, finished: bool) -> None:
        # num_tokens, as in push(): by now a start may have counted prefix hits as computed
        self.num_waiting -= 1
        self.num_deferred -= req.slo_deferred
        self.waiting_tokens -= req.num_tokens
        self.tenants.unqueued(req.tenant, finished=finished)
        name = self.bucket_name(req)
        if (self.tenants.waiting.get(name, 0) if self.config.tenant_fair_share
                else self.num_waiting) == 0:
            self._buckets.pop(name, None)  # only dead entries left: none to skip later
        if self.num_waiting == 0:
            self.timeouts.clear()  # nothing queued: every entry is dead

    # ---- the lane's part of the running set: Scheduler.start / preempt / finish, update
    def add_running(self, req: Request) -> None:
        self.num_running += 1
        self.num_decoding += req.decoding  # a running request moved from a removed lane
        self.tenants.started(req.tenant, req.decoding)

    def remove_running(self, req: Request) -> None:
        """`req` left the running set: finished (its status final) or preempted (status
        PREEMPTED: it is pushed back next, so its tenant stays active)."""
        self.num_running -= 1
        self.num_decoding -= req.decoding
        self.tenants.stopped(req.tenant, req.decoding,
                             requeued=req.status is RequestStatus.PREEMPTED)
        req.decoding = False
        if self.num_running == 0:
            self.batch_closed = False  # static batching: the next batch may form

    def add_decoding(self, req: Request) -> None:
        """`req` (running) has its prompt computed: from now on one token a step."""
        req.decoding = True
        self.num_decoding += 1
        add_count(self.tenants.decoding, req.tenant, 1)

    def charge_tenants(self, by_tenant: dict[str, int]) -> None:
        """Add a step's tokens to its tenants' virtual times (`tenant_fair_share`)."""
        self.tenants.charge(by_tenant)

    def expired(self, now: float, timeout_s: float) -> list[Request]:
        """Queued requests never scheduled past the queue timeout or their deadline."""
        if not self.num_waiting:
            return []  # the usual idle lane (its timeout entries were cleared with the last)
        return self.timeouts.expired(now, timeout_s, self.num_waiting)

    def queue_timeout_s(self, live: LiveConfig) -> float:
        """Seconds a never-scheduled request may wait here: the lane's queue_timeout_ms,
        else the global one."""
        ms = self.config.queue_timeout_ms
        return (ms if ms is not None else live.queue_timeout_ms) / 1000.0

    def queue_slo_share(self, now: float, ttft_s: float | None) -> float:
        """How much of the lane's TTFT target `ttft_s` its longest-waiting never-scheduled
        request has spent queued (1.0: it can no longer make it); 0.0 without a target or
        such a request."""
        oldest = self.timeouts.oldest_arrival() if self.num_waiting and ttft_s else None
        return 0.0 if oldest is None else max(0.0, now - oldest) / ttft_s

    def waiting_requests(self) -> list[Request]:
        return [e[1] for b in self._buckets.values() for e in b
                if e[1].status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)]

    def reconfigure(self, config: LaneConfig) -> None:
        """Apply new settings; queues are rebuilt when the order or bucketing changes."""
        old = self.config
        self.config = config
        if old.policy != config.policy or old.tenant_fair_share != config.tenant_fair_share:
            waiting = self.waiting_requests()
            self._buckets.clear()
            self.num_waiting = 0
            self.num_deferred = 0
            self.waiting_tokens = 0
            self.tenants.clear_queue(fair=config.tenant_fair_share)
            self.timeouts.clear()
            for req in sorted(waiting, key=lambda r: r.queue_seq):
                self.push(req)
        if (config.batching or "") != (old.batching or ""):
            self.batch_closed = False


class LaneSet:
    """All lanes, in config order; picks the lane whose turn it is for a new prefill."""

    def __init__(self, configs: tuple[LaneConfig, ...]):
        self.lanes: dict[str, LaneQueue] = {c.name: LaneQueue(c) for c in configs}

    def __getitem__(self, name: str) -> LaneQueue:
        return self.lanes[name]

    def __iter__(self):
        return iter(self.lanes.values())

    @property
    def num_waiting(self) -> int:
        return sum(lane.num_waiting for lane in self.lanes.values())

    def push(self, req: Request) -> None:
        lane = self.lanes[req.lane]
        if lane.num_waiting == 0:  # starts queueing: no credit for the time it did not
            others = [q for q in self.lanes.values() if q is not lane]
            lane.vtime = join_vtime(lane.vtime, [q.vtime for q in others if q.num_waiting],
                                    [q.vtime for q in others])
        lane.push(req)

    def pick(self, blocked: dict[str, str], step_vtimes: dict[str, float]) -> LaneQueue | None:
        """The lane with queued work, not in `blocked`, with the smallest virtual time.

        `step_vtimes`: virtual times with the step being scheduled counted, not yet charged.
        """
        best, best_vtime = None, math.inf
        for lane in self.lanes.values():
            if lane.num_waiting == 0 or lane.name in blocked:
                continue
            vtime = step_vtimes.get(lane.name, lane.vtime)
            if best is None or vtime < best_vtime:
                best, best_vtime = lane, vtime
        return best

    def reconfigure(self, configs: tuple[LaneConfig, ...], moves: dict[str, str],
                    requests: list[Request]) -> None:
        """Apply lane settings; requests of removed lanes move as `moves` says.

        The caller has checked that every removed lane with requests has a move target.
        """
        new_names = {c.name for c in configs}
        if not all(target in new_names for target in moves.values()):
            raise SchedulerInvariantError(f"lane moves {moves} name a lane not in"
                                          f" {sorted(new_names)}")
        old = self.lanes
        self.lanes = {}
        for config in configs:
            queue = old.get(config.name) or LaneQueue(config)
            queue.reconfigure(config)
            self.lanes[config.name] = queue
        for name, queue in old.items():
            if name in new_names:
                continue
            for req in requests:
                if req.lane == name:
                    req.lane = moves[name]
                    if req.status is RequestStatus.RUNNING:
                        self.lanes[req.lane].add_running(req)
            for req in sorted(queue.waiting_requests(), key=lambda r: r.queue_seq):
                self.push(req)

    def blocked(self, live: LiveConfig) -> dict[str, str]:
        """Lanes that may not start a request now, with why (their own limits)."""
        blocked = {}
        for lane in self.lanes.values():
            cfg = lane.config
            if cfg.max_running is not None and lane.num_running >= cfg.max_running:
                blocked[lane.name] = "lane_max_running"
            elif live.lane_batching(cfg) == "static" and lane.batch_closed:
                blocked[lane.name] = "static_batch"
        return blocked

    def waiting_reasons(self, blocked: dict[str, str], stop: str | None,
                        ) -> tuple[dict[str, int], dict[str, str]]:
        """Why queued requests did not start (their lane's block, else `stop`): the count
        by reason, and the reason by lane (lanes with queued requests only)."""
        counts: dict[str, int] = {}
        by_lane: dict[str, str] = {}
        for lane in self.lanes.values():
            if lane.num_waiting:
                reason = blocked.get(lane.name) or stop or "fair_share"
                counts[reason] = counts.get(reason, 0) + lane.num_waiting
                by_lane[lane.name] = reason
        return counts, by_lane
