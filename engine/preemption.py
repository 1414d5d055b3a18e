"""Victim choice for recompute preemption.

When a running request cannot get a KV block, a victim gives its blocks back and queues
again: requests of `preempt_first` lanes (batch) go first, then the lowest priority
(largest number), then the latest arrival. The request that needs the block may itself
be the victim, in which case it waits and the others keep their progress.
"""

from __future__ import annotations

from engine.lanes import LaneSet
from engine.request import Request


def victim_key(req: Request, lanes: LaneSet) -> tuple:
    """Larger means preempted sooner."""
    lane = lanes.lanes.get(req.lane)
    preempt_first = lane.config.preempt_first if lane is not None else False
    return (preempt_first, req.priority, req.arrival_time, req.queue_seq)


def pick_victim(running: list[Request], needy: Request, lanes: LaneSet) -> Request | None:
    """The running request to preempt so `needy` can grow (possibly `needy` itself)."""
    if not running:
        return None
    return max(running, key=lambda r: victim_key(r, lanes))
