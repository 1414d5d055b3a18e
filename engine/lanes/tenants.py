"""Per-tenant state of one lane: counts and fair-share virtual times of ACTIVE tenants.

A tenant is active in a lane while it has a request queued (WAITING or PREEMPTED) or
running there. The tenant comes from `X-Tenant` or the OpenAI `user` field, often one per
end user, so state kept for every tenant ever seen would grow without bound and every
step that walks it would slow down with the history. Hence:

- every count is a dict of entries > 0 only: a tenant at 0 is deleted;
- a tenant's virtual time is dropped with its last queued or running request, so when it
  returns it joins like a newcomer (see `join`);
- nothing here is walked per historic tenant: `join` reads a cached floor, recomputed
  over the queued tenants only after one left the queue or a step was charged.

Virtual times are in tokens (tenants share a lane with equal weights); see engine/lanes/queues.py.
"""

from __future__ import annotations


def add_count(counts: dict[str, int], key: str, delta: int) -> None:
    """counts[key] += delta, keeping only entries > 0 (a dict of active keys)."""
    num = counts.get(key, 0) + delta
    if num:
        counts[key] = num
    else:
        del counts[key]


class TenantBook:
    """Counts by tenant (entries > 0 only) and the virtual times of active tenants."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}  # queued requests (WAITING or PREEMPTED)
        self.running: dict[str, int] = {}
        self.decoding: dict[str, int] = {}  # running past their prompt: 1 token a step
        self.vtimes: dict[str, float] = {}  # tenant_fair_share only; active tenants only
        self.vtime_high = 0.0  # the highest virtual time a tenant here reached
        self._floor: float | None = None  # lowest virtual time among queued tenants
        self._floor_stale = False  # _floor must be recomputed before it is read

    def is_active(self, tenant: str) -> bool:
        return tenant in self.waiting or tenant in self.running

    # ---- queue side --------------------------------------------------------------------
    def queued(self, tenant: str, fair: bool) -> None:
        """One more queued request of `tenant`; `fair`: the lane shares among tenants, and
        a tenant that starts queueing joins (see `join`)."""
        if fair and tenant not in self.waiting:
            self.join(tenant)
        add_count(self.waiting, tenant, 1)

    def unqueued(self, tenant: str, *, finished: bool) -> None:
        """One queued request of `tenant` less: it starts (its tenant stays: it runs), or
        it `finished` while queued."""
        add_count(self.waiting, tenant, -1)
        if tenant not in self.waiting:
            self._floor_stale = True  # a tenant left the queue: the floor may rise
            if finished:
                self.forget_if_idle(tenant)

    # NOTE: a tenant with nothing queued or running has no state left, its virtual time
    # included, so on return it joins like a newcomer: level with the queued tenant
    # furthest behind, or with the highest reached when none is queued. Its lead from an
    # earlier visit is forgotten; as before, joining never puts it behind that floor.
    def join(self, tenant: str) -> None:
        """`tenant` starts queueing: its virtual time is never behind the others'."""
        floor = self.queued_floor()
        own = self.vtimes.get(tenant, 0.0)
        vtime = max(own, self.vtime_high if floor is None else floor)
        self.vtimes[tenant] = vtime
        self.vtime_high = max(self.vtime_high, vtime)
        self._floor = vtime if floor is None else floor  # a join never lowers the floor

    def queued_floor(self) -> float | None:
        """The lowest virtual time among tenants with a queued request (None: none is)."""
        if self._floor_stale:
            vtimes = self.vtimes
            self._floor = min((vtimes.get(t, 0.0) for t in self.waiting), default=None)
            self._floor_stale = False
        return self._floor

    def clear_queue(self, *, fair: bool) -> None:
        """The lane's queue is rebuilt (its requests pushed again); virtual times are kept
        only while the lane shares among tenants (`fair`)."""
        self.waiting.clear()
        if not fair:
            self.vtimes.clear()
        self._floor_stale = True

    # ---- running side ------------------------------------------------------------------
    def started(self, tenant: str, decoding: bool) -> None:
        add_count(self.running, tenant, 1)
        if decoding:
            add_count(self.decoding, tenant, 1)

    def stopped(self, tenant: str, decoding: bool, *, requeued: bool) -> None:
        """A running request of `tenant` stopped: finished, or preempted (`requeued`: it
        is pushed back next, so its tenant stays)."""
        add_count(self.running, tenant, -1)
        if decoding:
            add_count(self.decoding, tenant, -1)
        if not requeued:
            self.forget_if_idle(tenant)

    def forget_if_idle(self, tenant: str) -> None:
        if tenant not in self.waiting and tenant not in self.running:
            self.vtimes.pop(tenant, None)

    def charge(self, by_tenant: dict[str, int]) -> None:
        """Add a step's tokens to its tenants' virtual times: they ran, so are active."""
        vtimes = self.vtimes
        high = self.vtime_high
        for tenant, num in by_tenant.items():
            vtime = vtimes[tenant] = vtimes.get(tenant, 0.0) + num
            high = max(high, vtime)
        self.vtime_high = high
        self._floor_stale = True

    def __len__(self) -> int:
        """Entries held in all: bounded by a few per active tenant."""
        return len(self.waiting) + len(self.running) + len(self.decoding) + len(self.vtimes)
