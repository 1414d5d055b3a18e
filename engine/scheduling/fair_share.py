"""Fair-share accounting: what each lane (and tenant) ran in a step, charged once.

Lanes' virtual times (tokens / weight) decide which lane starts the next prefill; see
engine/lanes/queues.py. A step's tokens are tallied in a `StepCharges` as its work becomes final
(the running set's after its pass, each new prefill as it starts), with the virtual time
each lane reaches by them; picks made during the step read those. `charge()` installs
them in the lanes (and adds the tenants' tokens) once, at the end of `schedule()`.

Decode tokens are tallied from the lanes' decoding counts (kept by the running set's
verbs) when every decoding request decoded, the usual step: no per-token work. Per-tenant
counts hold active tenants only (engine/lanes/tenants.py), so neither does a step do work per
tenant that has left.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import attrgetter

from engine.lanes.queues import LaneQueue, LaneSet
from engine.records import SchedulerOutput

_lane = attrgetter("lane")
_tenant = attrgetter("tenant")


@dataclass(slots=True)
class StepCharges:
    """Tokens run in one step, by lane, and by tenant in lanes with tenant fair share."""

    by_lane: dict[str, int]  # the step's tokens_by_lane
    by_tenant: dict[str, dict[str, int]]  # {lane: {tenant: tokens}}
    vtimes: dict[str, float]  # virtual time of each lane in by_lane, its tokens counted

    def add(self, lane: LaneQueue, tenant: str, num_tokens: int) -> None:
        """A new prefill's tokens (its lane's and tenant's turn now comes later)."""
        name = lane.name
        self.by_lane[name] = self.by_lane.get(name, 0) + num_tokens
        self.vtimes[name] = self.vtimes.get(name, lane.vtime) + num_tokens / lane.config.weight
        if lane.config.tenant_fair_share:
            tenants = self.by_tenant.setdefault(name, {})
            tenants[tenant] = tenants.get(tenant, 0) + num_tokens


def tally_running(lanes: LaneSet, out: SchedulerOutput) -> StepCharges:
    """The running set's tokens this step: its decodes and prompt chunks, by lane/tenant.

    When every decoding request decoded (the usual case), each lane's decode tokens are
    its decoding count, kept up to date at state changes: no per-token work.
    """
    tokens: dict[str, int] = {}
    by_tenant: dict[str, dict[str, int]] = {}
    queues = lanes.lanes
    if len(out.decodes) == sum(lane.num_decoding for lane in queues.values()):
        for lane in queues.values():
            if lane.num_decoding:
                tokens[lane.name] = lane.num_decoding
                if lane.config.tenant_fair_share:  # active decoding tenants only
                    by_tenant[lane.name] = dict(lane.tenants.decoding)
    else:  # some decodes did not fit: count them
        decodes = out.decodes
        tokens.update(Counter(map(_lane, decodes)))
        for (name, tenant), num in Counter(zip(map(_lane, decodes), map(_tenant, decodes),
                                               strict=True)).items():
            if queues[name].config.tenant_fair_share:
                by_tenant.setdefault(name, {})[tenant] = num
    for chunk in out.prefills:
        req = chunk.request
        tokens[req.lane] = tokens.get(req.lane, 0) + chunk.num_tokens
        if queues[req.lane].config.tenant_fair_share:
            tenants = by_tenant.setdefault(req.lane, {})
            tenants[req.tenant] = tenants.get(req.tenant, 0) + chunk.num_tokens
    vtimes = {}
    for name, num in tokens.items():
        lane = queues[name]
        vtimes[name] = lane.vtime + num / lane.config.weight
    return StepCharges(tokens, by_tenant, vtimes)


def charge(lanes: LaneSet, charges: StepCharges) -> None:
    """Charge the step to the lanes: their virtual times, and their tenants' tokens."""
    queues = lanes.lanes
    for name, vtime in charges.vtimes.items():
        queues[name].vtime = vtime
    for name, tenants in charges.by_tenant.items():
        queues[name].charge_tenants(tenants)
