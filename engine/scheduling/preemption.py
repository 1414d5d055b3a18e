"""Victim choice for recompute preemption.

A victim gives its blocks back and queues again with its progress dropped (its full blocks
stay in the prefix cache, so a restart often recomputes little). Victims go in one order,
`victim_key`: requests of `preempt_first` lanes (batch) first, then the lowest priority
(largest number), then the latest arrival. Two rules preempt:

- To grow: a running request that cannot get a KV block preempts the first victim, which
  may be itself (then it waits and the others keep their progress).
- To start: a queued request of a `preempt_to_start` lane that the KV keeps from starting
  (usage would pass `kv_cache_high_watermark`) preempts running requests of
  `preempt_first` lanes only, the fewest that free enough, or none if even all of them
  would not. No ping-pong: a lane may not have both settings (`LaneConfig.validate`), so
  a request started by this rule is never a victim of it; and above the watermark only
  `preempt_to_start` lanes start requests (`block_for_kv`), so a victim does not start
  again by taking back what was freed for the request that preempted it.
"""

from __future__ import annotations

from collections import Counter

from engine.lanes.queues import LaneSet
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


def block_for_kv(lanes: LaneSet, blocked: dict[str, str]) -> bool:
    """KV usage is above the high watermark: block every lane without `preempt_to_start`
    for the rest of the step; True if a lane that may preempt to start has queued work."""
    may_go = False
    for lane in lanes:
        if lane.name in blocked:
            continue
        if lane.config.preempt_to_start and lane.num_waiting:
            may_go = True
        else:
            blocked[lane.name] = "kv_high_watermark"
    return may_go


def victims_to_start(needy: Request, need: int, running: list[Request], lanes: LaneSet,
                     num_used: int, num_blocks: int, watermark: float,
                     spare: list[Request] = ()) -> list[Request]:
    """The fewest running requests of preempt_first lanes (not in `spare`), in victim
    order, whose preemption lets `needy` (queued, holding its prefix-cache hits) take
    `need` more blocks within the high watermark; [] when even all of them would not.

    A block is freed only when all its holders go (prefix blocks are shared), so blocks are
    counted by holder: the running requests and `needy`. Runs only when a start is refused
    for the KV: O(blocks held by the running set).
    """
    candidates = [r for r in running if _preempt_first(r, lanes) and r not in spare]
    if not candidates:
        return []
    candidates.sort(key=lambda r: victim_key(r, lanes), reverse=True)
    holders = Counter(b for r in running for b in r.block_ids)
    holders.update(needy.block_ids)
    limit = watermark * num_blocks
    freed = 0
    for k, victim in enumerate(candidates, 1):
        for block_id in victim.block_ids:
            holders[block_id] -= 1
            freed += holders[block_id] == 0
        used = num_used - freed
        if used + need <= limit or (k == len(running) and used + need <= num_blocks):
            return candidates[:k]  # (none left running: only the pool's size limits it)
    return []


def _preempt_first(req: Request, lanes: LaneSet) -> bool:
    lane = lanes.lanes.get(req.lane)
    return lane is not None and lane.config.preempt_first
