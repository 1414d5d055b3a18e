"""The fleet routing header (control/api/routed.py): only a fleet replica reads it, a
garbled value reads as nothing, and the ingress drops a client's copy before adding its
own."""

from __future__ import annotations

from control.api.routed import (
    BLOCKS_ATTR,
    REASON_ATTR,
    ROUTED_HEADER,
    routed_attributes,
    routed_value,
    routing_of,
)
from control.fleet.forward import upstream_headers


def test_a_replica_reads_the_ingress_decision_and_a_server_ignores_it():
    headers = {ROUTED_HEADER: routed_value("precise", 12).decode()}
    attrs = routed_attributes(headers, fleet_replica=True)
    assert attrs == ((REASON_ATTR, "precise"), (BLOCKS_ATTR, 12))
    assert routing_of(attrs + (("gen_ai.request.model", "m"),)) == ("precise", 12)
    # one server is reachable by clients: their header must not reach its trace
    assert routed_attributes(headers, fleet_replica=False) == ()
    affinity = routed_attributes({ROUTED_HEADER: routed_value("affinity", None).decode()},
                                 fleet_replica=True)
    assert routing_of(affinity) == ("affinity", None)


def test_garbled_values_read_as_no_decision():
    for value in ("", "precise", "reason=Precise", "reason=precise; blocks=-1",
                  "reason=precise; blocks=1234567890", "reason=a;blocks=1",
                  "reason=" + "x" * 33, "reason=precise; blocks=1; extra"):
        assert routed_attributes({ROUTED_HEADER: value}, fleet_replica=True) == (), value
    assert routing_of(()) == (None, None)


def test_the_ingress_drops_a_clients_routing_header():
    raw = [(b"x-tenant", b"acme"), (b"X-Batchpilot-Routed", b"reason=random; blocks=9"),
           (b"host", b"x")]
    assert upstream_headers(raw) == [(b"x-tenant", b"acme")]


def test_a_precise_route_to_a_cold_replica_says_it_matched_no_blocks():
    """0 matched blocks is a fact of precise routing (the prompt was cached nowhere), not
    "unknown": the trace must tell it apart from routing that does not count blocks."""
    header = routed_value("precise", 0).decode()
    assert header == "reason=precise; blocks=0"
    assert routing_of(routed_attributes({ROUTED_HEADER: header}, fleet_replica=True)) == (
        "precise", 0)
