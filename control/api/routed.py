"""Why a fleet's ingress sent a request to this replica, carried on the forwarded request
as one header and kept on the request's trace link, so the replica's trace row (and its
span) says it: `trace request ID` over a fleet answers "why did it go there".

    ingress (control/fleet/ingress.py)        replica (control/api/routes.py)
    drop the client's copy of the header      read it only when this server is a fleet
    add "reason=precise; blocks=12"        -> replica (ServeSettings.replica_name), which
                                              only its ingress can reach (a Serve handle)

A server that is not a fleet replica ignores the header: a client cannot write its own
routing story into the trace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

ROUTED_HEADER = "x-batchpilot-routed"
REASON_ATTR = "batchpilot.routing_reason"
BLOCKS_ATTR = "batchpilot.routing_matched_blocks"
_VALUE = re.compile(r"reason=([a-z_]{1,32})(?:; blocks=(\d{1,9}))?")


def routed_value(reason: str, matched_blocks: int | None) -> bytes:
    """The header's value for a decision; `matched_blocks` None: the router did not know
    (any routing but precise)."""
    blocks = "" if matched_blocks is None else f"; blocks={int(matched_blocks)}"
    return f"reason={reason}{blocks}".encode()


def routed_attributes(headers: Mapping[str, str], fleet_replica: bool,
                      ) -> tuple[tuple[str, object], ...]:
    """The routing decision as span attributes, () when this server is not a fleet
    replica or the header is absent or garbled (then the ingress did not write it)."""
    value = headers.get(ROUTED_HEADER) if fleet_replica else None
    match = _VALUE.fullmatch(value) if value else None
    if match is None:
        return ()
    reason, blocks = match.groups()
    return ((REASON_ATTR, reason),) + (((BLOCKS_ATTR, int(blocks)),) if blocks else ())


def routing_of(attributes: tuple[tuple[str, object], ...]) -> tuple[str | None, int | None]:
    """(reason, matched blocks) from a trace link's attributes; None where absent."""
    found = dict(attributes)
    reason, blocks = found.get(REASON_ATTR), found.get(BLOCKS_ATTR)
    return (reason if isinstance(reason, str) else None,
            blocks if isinstance(blocks, int) else None)
