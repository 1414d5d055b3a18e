"""The ingress's view of each replica's load: stats polled every `poll_s`, plus the
requests this ingress has in flight to it (counted at once, so a burst between two polls
does not all land on one replica).

A replica is healthy while its last poll answered ready and no call to it has failed
since, unless MAX_LATE_POLLS polls or calls in a row went unanswered in time (a poll past
its timeout, a call not accepted within forward.ACCEPT_TIMEOUT_S). A failed call or poll
marks it down at once (a killed replica stops getting new requests before the next poll);
a late one alone does not: a replica whose CPU its own steps saturate answers slowly and is
busy, not dead (a fleet smoke on 2 cores got 503 "no replica is healthy" while its lone
replica served a burst). A poll that answers ready brings it back (Serve restarted it).
It is routed to while healthy and not excluded (a rolling restart takes it out: restart.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from control.fleet.router import ReplicaLoad

log = logging.getLogger("batchpilot.fleet")

POLL_S = 0.2  # between two polls of one replica
POLL_TIMEOUT_S = 1.0  # a poll slower than this (after its wait) is late
MAX_LATE_POLLS = 3  # late polls in a row that mark the replica down (~6 s unanswered)
# a poll whose answer routing would read as the last one waits at the replica up to this
# long for a change (EngineReplica.stats): an idle replica is asked once a second, not 5x
STATS_WAIT_S = 1.0
MAX_STATS_WAIT_S = 5.0
# what routing, autoscaling, the control plane and restarts read of a replica's stats: a
# change in any of them ends a stats long poll (`steps` and the like do not)
ROUTING_FIELDS = ("ready", "reason", "incarnation", "waiting", "running", "kv_usage",
                  "queue_slo_share", "inflight", "fleet_version")


def routing_key(stats: dict[str, Any]) -> tuple:
    """What of `stats` a long poll compares (ROUTING_FIELDS' values, in order)."""
    return tuple(stats.get(name) for name in ROUTING_FIELDS)


@dataclass
class ReplicaView:
    replica_id: int
    healthy: bool = False  # until its first poll answers
    inflight: int = 0
    polled: dict[str, Any] = field(default_factory=dict)
    polled_at: float | None = None  # time.monotonic() of the last answer
    failures: int = 0  # calls that failed (replica died under them), ever
    late_polls: int = 0  # polls (or calls) in a row not answered in time
    routable: bool = True  # False while a rolling restart has taken it out (restart.py)
    # (time.monotonic(), fleet version) of the last push it took (control_plane.py): a
    # poll asked before then may answer the version it ran before the push
    pushed: tuple[float, int] | None = None

    def load(self, in_service: bool = True) -> ReplicaLoad:
        """`in_service`: False while autoscaling has the replica's slot off or draining."""
        p = self.polled
        # the router sees an excluded replica as down; the control plane (which reads
        # `healthy`) still pushes it config, so it converges before it is routed to again
        return ReplicaLoad(self.replica_id, self.healthy and self.routable and in_service,
                           int(p.get("waiting", 0)), int(p.get("running", 0)), self.inflight,
                           float(p.get("kv_usage", 0.0)))


class LoadTable:
    def __init__(self, num_replicas: int):
        self.views = [ReplicaView(i) for i in range(num_replicas)]

    def snapshot(self, in_service: Callable[[int], bool] | None = None) -> list[ReplicaLoad]:
        """Every replica's load; `in_service(id)` (autoscaling's say) as well as health."""
        return [view.load(in_service is None or in_service(view.replica_id))
                for view in self.views]

    def started(self, replica_id: int) -> None:
        self.views[replica_id].inflight += 1

    def done(self, replica_id: int) -> None:
        self.views[replica_id].inflight -= 1

    def exclude(self, replica_id: int) -> None:
        """No new requests to it; those already sent finish there (`inflight` counts them)."""
        self.views[replica_id].routable = False

    def include(self, replica_id: int) -> None:
        self.views[replica_id].routable = True

    def failed(self, replica_id: int, why: str) -> None:
        view = self.views[replica_id]
        view.failures += 1
        if view.healthy:
            log.warning("replica %d marked down: %s", replica_id, why)
        view.healthy = False

    def polled(self, replica_id: int, stats: dict[str, Any] | None,
               asked_at: float | None = None) -> None:
        """A poll's answer: stats, or None when it failed (down at once). `asked_at`: the
        time.monotonic() the poll was sent; one sent before the replica's last push keeps
        the pushed fleet version (it may have been answered before the push landed)."""
        view = self.views[replica_id]
        view.late_polls = 0
        if stats is None:
            view.healthy = False
            return
        if view.pushed is not None and asked_at is not None and asked_at < view.pushed[0]:
            stats = {**stats, "fleet_version": view.pushed[1]}
        if not view.healthy and stats.get("ready"):
            log.info("replica %d is up (pid %s)", replica_id, stats.get("pid"))
        view.polled, view.polled_at = stats, time.monotonic()
        view.healthy = bool(stats.get("ready"))


    def late(self, replica_id: int, what: str = "poll") -> None:
        """A poll or call not answered in time: down after MAX_LATE_POLLS in a row (an
        answered poll starts the count over)."""
        view = self.views[replica_id]
        view.late_polls += 1
        if view.late_polls >= MAX_LATE_POLLS and view.healthy:
            log.warning("replica %d marked down: %d polls or calls in a row unanswered in"
                        " time (the last: %s)", replica_id, view.late_polls, what)
            view.healthy = False


async def poll_forever(table: LoadTable, replica_id: int,
                       fetch: Callable[[tuple | None, float], Awaitable[dict[str, Any]]],
                       poll_s: float = POLL_S, timeout_s: float = POLL_TIMEOUT_S,
                       active: Callable[[], bool] | None = None,
                       wait_s: float = STATS_WAIT_S) -> None:
    """One replica's poll loop, until cancelled; `fetch(since, wait_s)` returns its stats
    dict, waiting up to wait_s while they are `since` (the routing_key of the last answer
    while healthy: a replica that is down answers at once). While `active()` is false
    (autoscaling has no replica in its slot) it is not called: it reads as down, without
    counting a failure."""
    while True:
        if active is not None and not active():
            table.polled(replica_id, None)
            await asyncio.sleep(poll_s)
            continue
        late, asked_at = False, time.monotonic()
        view = table.views[replica_id]
        since = routing_key(view.polled) if view.healthy and view.polled else None
        try:
            stats = await asyncio.wait_for(fetch(since, wait_s), wait_s + timeout_s)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:  # busy or gone: down only after several in a row
            stats, late = None, True
        except Exception:  # down or restarting: not routed to until it answers
            stats = None
        task = asyncio.current_task()
        if task is not None and getattr(task, "cancelling", lambda: 0)():  # 3.11+
            # NOTE: Python 3.11's wait_for may swallow a cancel that lands as fetch()
            # completes; without this the loop would poll on and stop_polls never return
            raise asyncio.CancelledError
        if late:
            table.late(replica_id)
        else:
            table.polled(replica_id, stats, asked_at)
        await asyncio.sleep(poll_s)
