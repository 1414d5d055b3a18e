"""The ingress's map of which prefix-cache blocks each replica holds, kept from the
replicas' KV events (engine/kv/events.py, served by EngineReplica.kv_events).

    follow_forever(index, i, fetch)   one loop per replica: fetch(epoch, seq, WAIT_S), at
                                      most every poll_s; the replica answers at once when
                                      it has news, else when a batch comes or WAIT_S passed
    index.apply(i, reply)             a snapshot replaces replica i's set; batches update it
    index.matched(i, keys)            leading keys of a request replica i holds

A reply's epoch is the replica process's incarnation: a restarted replica answers the
reader's old cursor with a full snapshot, as it does a reader that fell behind its log
(`gaps`). The index holds keys only (ints), never text; it may lag a replica by one poll,
which costs a miss, never a wrong answer (the replica looks its cache up itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("batchpilot.fleet")

POLL_S = 0.1  # at least between two reads of one replica's events (10 a second at most)
# a read with nothing new waits at the replica up to this long for the next batch (a long
# poll): an idle fleet reads each replica ~once per WAIT_S instead of 1 / POLL_S times
WAIT_S = 2.0
POLL_TIMEOUT_S = WAIT_S + 2.0  # the wait, then a snapshot of a large pool: a step or two


@dataclass
class ReplicaBlocks:
    epoch: str | None = None  # the incarnation `keys` belong to; None: never read
    seq: int = 0  # the last event batch applied
    keys: set[int] = field(default_factory=set)
    snapshots: int = 0  # full reads (first read, restarts, reads that fell behind)
    batches: int = 0  # event batches applied
    dropped: int = 0  # the replica's count of batches it dropped unread
    updated_at: float | None = None  # time.monotonic() of the last reply


class KVIndex:
    def __init__(self, num_replicas: int):
        self.replicas = [ReplicaBlocks() for _ in range(num_replicas)]
        # the pool's hashing, from the replicas' replies (every replica runs one config)
        self.block_size: int | None = None
        self.sharing = "tenant"
        self.enabled = False  # some replica publishes events, with prefix caching on

    def cursor(self, replica_id: int) -> tuple[str | None, int]:
        blocks = self.replicas[replica_id]
        return blocks.epoch, blocks.seq

    def apply(self, replica_id: int, reply: dict[str, Any]) -> None:
        """One kv_events reply: a snapshot, or the event batches after our cursor."""
        if not reply.get("enabled"):
            return
        blocks = self.replicas[replica_id]
        self.block_size, self.sharing = int(reply["block_size"]), str(reply["sharing"])
        self.enabled = bool(reply.get("prefix_caching", True))
        if "snapshot" in reply:
            if blocks.epoch not in (None, reply["epoch"]):
                log.info("replica %d restarted: its KV index starts from a snapshot",
                         replica_id)
            blocks.keys = set(reply["snapshot"])
            blocks.snapshots += 1
        else:
            for stored, removed in reply["batches"]:
                blocks.keys.difference_update(removed)
                blocks.keys.update(stored)
                blocks.batches += 1
        blocks.epoch, blocks.seq = reply["epoch"], int(reply["seq"])
        blocks.dropped = int(reply.get("dropped", 0))
        blocks.updated_at = time.monotonic()

    def matched(self, replica_id: int, keys: Sequence[int]) -> int:
        """How many of `keys` (a request's chain, in order) replica `replica_id` holds
        from the first on: a chain's block i is only usable with blocks 0..i-1."""
        held = self.replicas[replica_id].keys
        for count, key in enumerate(keys):
            if key not in held:
                return count
        return len(keys)

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        return {i: self.matched(i, keys) for i in range(len(self.replicas))}

    def families_data(self) -> list[dict[str, Any]]:
        """Per replica, for /metrics and /readyz: blocks known, reads, drops."""
        return [{"replica_id": i, "blocks": len(b.keys), "snapshots": b.snapshots,
                 "batches": b.batches, "dropped": b.dropped} for i, b in
                enumerate(self.replicas)]


async def follow_forever(index: KVIndex, replica_id: int,
                         fetch: Callable[[str | None, int, float], Awaitable[dict[str, Any]]],
                         poll_s: float = POLL_S, timeout_s: float = POLL_TIMEOUT_S,
                         active: Callable[[], bool] | None = None,
                         wait_s: float = WAIT_S) -> None:
    """Keep replica `replica_id`'s entry current until cancelled. A replica that does not
    answer, or whose slot autoscaling has off (`active()` false: not called), keeps its
    last keys: nothing is routed to it, and when it comes back its new epoch brings a
    snapshot."""
    while True:
        if active is not None and not active():
            await asyncio.sleep(poll_s)
            continue
        try:
            reply = await asyncio.wait_for(fetch(*index.cursor(replica_id), wait_s),
                                           timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # down or restarting: the load poll says so
            reply = None
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # wait_for may swallow a cancel
            raise asyncio.CancelledError
        if reply is not None:
            index.apply(replica_id, reply)
            if not reply.get("enabled"):
                return  # this replica publishes no events: nothing to follow
        await asyncio.sleep(poll_s)
