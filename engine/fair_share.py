"""Fair-share accounting: charge each lane (and tenant) for the tokens it ran in a step.

Lanes' virtual times (tokens / weight) decide which lane starts the next prefill; see
engine/lanes.py. Decode tokens are charged from decoding counts kept up to date at state
changes, so the usual step does no per-token work here.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

from engine.lanes import LaneSet
from engine.records import SchedulerOutput

_lane = attrgetter("lane")
_tenant = attrgetter("tenant")


def charge_running(lanes: LaneSet, out: SchedulerOutput) -> None:
    """Charge each lane (and tenant) for its running requests' tokens this step.

    When every decoding request decoded (the usual case), each lane's decode tokens
    are its decoding count, kept up to date at state changes: no per-token work.
    """
    tokens = out.tokens_by_lane
    if len(out.decodes) == sum(lane.num_decoding for lane in lanes):
        for lane in lanes:
            if lane.num_decoding:
                tokens[lane.name] = lane.num_decoding
        decode_tenants = [((lane.name, t), n) for lane in lanes
                          for t, n in lane.decoding_by_tenant.items() if n]
    else:  # some decodes did not fit: count them
        tokens.update(Counter(map(_lane, out.decodes)))
        decode_tenants = list(Counter(zip(map(_lane, out.decodes),
                                          map(_tenant, out.decodes), strict=True)).items())
    for chunk in out.prefills:
        tokens[chunk.request.lane] = tokens.get(chunk.request.lane, 0) + chunk.num_tokens
    for name, num in tokens.items():
        lane = lanes[name]
        lane.vtime += num / lane.config.weight
    for (name, tenant), num in decode_tenants:
        if lanes[name].config.tenant_fair_share:
            lanes[name].charge_tenant(tenant, num)
    for chunk in out.prefills:
        lane = lanes[chunk.request.lane]
        if lane.config.tenant_fair_share:
            lane.charge_tenant(chunk.request.tenant, chunk.num_tokens)
