"""Lane counters recomputed from the requests themselves (`check_lanes`, which
`Engine.check_integrity()` calls beside the block manager's check).

The lanes keep derived counters so that a step does no per-request or per-tenant work:
queued and running counts, decoding counts, queued tokens, counts by tenant, tenant
buckets and virtual times. A verb that forgets one leaves a counter that drifts silently
(a lane that looks busy forever, a tenant charged for tokens it did not run). This check
recounts everything from the unfinished requests and the scheduler's running set and
raises `LaneIntegrityError` naming the lane, the counter, the expected and the actual
value. It raises, never asserts, so `python -O` keeps it. O(requests + queue entries).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from engine.errors import SchedulerInvariantError
from engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.lanes.queues import LaneQueue, LaneSet

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class LaneIntegrityError(SchedulerInvariantError):
    """A lane's (or the running set's) derived state disagrees with the requests: a bug."""


def _expect(where: str, counter: str, expected: object, actual: object) -> None:
    if expected != actual:
        raise LaneIntegrityError(f"{where}: {counter} is {actual!r}, but the requests give"
                                 f" {expected!r}")


def check_running_set(requests: list[Request], running: list[Request]) -> None:
    """Every RUNNING request is in `running` exactly once, and nothing else is."""
    counts = Counter(id(r) for r in running)
    for req in running:
        _expect(f"running set, request {req.request_id!r}", "status", "RUNNING",
                req.status.name)
        _expect(f"running set, request {req.request_id!r}", "entries", 1, counts[id(req)])
    unfinished = {id(r) for r in requests}
    for req in running:
        if id(req) not in unfinished:
            raise LaneIntegrityError(f"running set: request {req.request_id!r} is in it but"
                                     " not among the engine's unfinished requests")
    for req in requests:
        if req.status is RequestStatus.RUNNING:
            _expect(f"running set, request {req.request_id!r}", "entries", 1, counts[id(req)])


def check_lanes(lanes: LaneSet, requests: list[Request], running: list[Request]) -> None:
    """Recount every lane's derived state from `requests` (the unfinished ones) and the
    scheduler's `running` list; raise LaneIntegrityError at the first difference."""
    check_running_set(requests, running)
    by_lane: dict[str, list[Request]] = {name: [] for name in lanes.lanes}
    for req in requests:
        if req.lane not in by_lane:
            raise LaneIntegrityError(f"request {req.request_id!r}: its lane {req.lane!r} is"
                                     f" not a lane ({', '.join(by_lane)})")
        if req.decoding and req.status is not RequestStatus.RUNNING:
            raise LaneIntegrityError(f"request {req.request_id!r}: decoding while"
                                     f" {req.status.name}")
        by_lane[req.lane].append(req)
    for name, lane in lanes.lanes.items():
        _check_lane(lane, by_lane[name])


def _check_lane(lane: LaneQueue, requests: list[Request]) -> None:
    where = f"lane {lane.name!r}"
    queued = [r for r in requests if r.status in _QUEUED]
    running = [r for r in requests if r.status is RequestStatus.RUNNING]
    decoding = [r for r in running if r.decoding]
    _expect(where, "num_waiting", len(queued), lane.num_waiting)
    _expect(where, "waiting_tokens", sum(r.num_tokens for r in queued), lane.waiting_tokens)
    _expect(where, "num_running", len(running), lane.num_running)
    _expect(where, "num_decoding", len(decoding), lane.num_decoding)
    book = lane.tenants
    _expect(where, "waiting by tenant", _by_tenant(queued), book.waiting)
    _expect(where, "running by tenant", _by_tenant(running), book.running)
    _expect(where, "decoding by tenant", _by_tenant(decoding), book.decoding)
    stale = sorted(set(book.vtimes) - set(book.waiting) - set(book.running))
    _expect(where, "virtual times of tenants with nothing queued or running", [], stale)
    # the buckets: each queued request once, in its bucket; no bucket without one
    live: Counter[str] = Counter()
    for name, bucket in lane.buckets().items():
        for _, req in bucket:
            if req.status in _QUEUED:
                _expect(f"{where}, request {req.request_id!r}", "bucket", lane.bucket_name(req),
                        name)
                live[name] += 1
    expected = dict(Counter(lane.bucket_name(r) for r in queued))
    _expect(where, "queued requests by bucket", expected, dict(live))
    _expect(where, "buckets", sorted(expected), sorted(lane.buckets()))
    entries = Counter(id(e[1]) for b in lane.buckets().values() for e in b
                      if e[1].status in _QUEUED)
    for req in queued:
        _expect(f"{where}, request {req.request_id!r}", "queue entries", 1, entries[id(req)])
    # every never-scheduled queued request can still time out
    tracked = lane.timeouts.tracked()
    for req in queued:
        if req.first_scheduled_time is None and id(req) not in tracked:
            raise LaneIntegrityError(f"{where}: request {req.request_id!r} is queued, never"
                                     " scheduled, and not tracked for its queue timeout")


def _by_tenant(requests: list[Request]) -> dict[str, int]:
    return dict(Counter(r.tenant for r in requests))
