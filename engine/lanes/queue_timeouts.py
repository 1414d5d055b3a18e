"""Queue timeouts of one lane: which never-scheduled requests have waited too long.

A request that was never scheduled times out once it has waited longer than its lane's
queue timeout since its `arrival_time`, or once its deadline has passed. Both are found
by time, in heaps keyed by arrival time and by deadline, never by push order: a request
can join a lane behind newer ones (moved from a removed lane, replayed with an older
`arrival_time`) and must still expire on time. The timeout is the same for every request
of a lane, so arrival order is expiry order whatever the timeout is now: a live change of
`queue_timeout_ms` applies to every queued request from the next step.

A request scheduled once (then preempted, queued again) is past its queue wait: it is not
kept here. Entries of requests that started or finished are dropped lazily, at the head,
or all at once when they outnumber the queued requests (O(n), amortised over n pushes).
"""

from __future__ import annotations

import heapq

from engine.request import Request

_COMPACT_SLACK = 64  # dead entries tolerated beyond the queued count before a compaction


def _gone(req: Request) -> bool:
    """Started (its queue wait is over) or finished: nothing left to expire."""
    return req.first_scheduled_time is not None or req.is_finished


class QueueTimeouts:
    """Never-scheduled queued requests of one lane, by arrival time and by deadline."""

    def __init__(self) -> None:
        # (arrival_time or deadline [s, engine clock], queue_seq, request): queue_seq is
        # unique per request, so a tie never compares requests.
        self._by_arrival: list[tuple[float, int, Request]] = []
        self._by_deadline: list[tuple[float, int, Request]] = []

    def push(self, req: Request) -> None:
        if req.first_scheduled_time is not None:
            return  # queued again after a preemption: its queue wait ended when it started
        heapq.heappush(self._by_arrival, (req.arrival_time, req.queue_seq, req))
        if req.deadline is not None:
            heapq.heappush(self._by_deadline, (req.deadline, req.queue_seq, req))

    def clear(self) -> None:
        self._by_arrival.clear()
        self._by_deadline.clear()

    def tracked(self) -> set[int]:
        """id() of every request with an arrival entry (for checks)."""
        return {id(e[2]) for e in self._by_arrival}

    def __len__(self) -> int:
        """Entries held, dead ones included (bounded: see the module docstring)."""
        return len(self._by_arrival) + len(self._by_deadline)

    def oldest_arrival(self) -> float | None:
        """Arrival time (engine clock) of the longest-waiting never-scheduled request; the
        dead entries ahead of it are dropped on the way."""
        arrivals = self._by_arrival
        while arrivals and _gone(arrivals[0][2]):
            heapq.heappop(arrivals)
        return arrivals[0][0] if arrivals else None

    def expired(self, now: float, timeout_s: float, num_queued: int) -> list[Request]:
        """Requests never scheduled that waited more than `timeout_s` or whose deadline
        passed, each once; `num_queued` (the lane's queued count) bounds the dead entries."""
        arrivals, deadlines = self._by_arrival, self._by_deadline
        if not arrivals and not deadlines:
            return []  # the usual idle lane: nothing to walk
        out: list[Request] = []
        while arrivals:
            req = arrivals[0][2]
            if _gone(req):
                heapq.heappop(arrivals)
            elif now - req.arrival_time > timeout_s:
                out.append(heapq.heappop(arrivals)[2])
            else:
                break
        taken = set(map(id, out))
        while deadlines and (_gone(deadlines[0][2]) or deadlines[0][0] < now):
            req = heapq.heappop(deadlines)[2]
            if not _gone(req) and id(req) not in taken:
                out.append(req)
        for heap in (arrivals, deadlines):
            if len(heap) > 2 * num_queued + _COMPACT_SLACK:
                heap[:] = [e for e in heap if not _gone(e[2]) and id(e[2]) not in taken]
                heapq.heapify(heap)
        return out
