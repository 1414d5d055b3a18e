"""W3C trace context at the edge (control/otel/context.py): only bit 0 of the trace flags
means sampled (a level-2 caller's random-trace-id bit does not), and each later choice of
an n > 1 request is a span of its own in the caller's trace."""

from __future__ import annotations

import pytest

from control.otel.context import child_link, link_from_headers, parse_traceparent, traceparent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.mark.parametrize(("flags", "sampled"), [("00", False), ("01", True), ("02", False),
                                                ("03", True), ("fe", False), ("ff", True)])
def test_only_the_sampled_bit_of_the_flags_means_sampled(flags, sampled):
    assert parse_traceparent(f"00-{TRACE_ID}-{PARENT}-{flags}") == (TRACE_ID, PARENT, sampled)


def test_each_later_choice_is_a_span_of_its_own_under_the_same_parent():
    link = link_from_headers({"traceparent": f"00-{TRACE_ID}-{PARENT}-01"},
                             (("gen_ai.operation.name", "chat"),))
    siblings = [child_link(link) for _ in range(3)]
    assert len({link.span_id, *(s.span_id for s in siblings)}) == 4
    for sibling in siblings:
        assert (sibling.trace_id, sibling.parent_span_id, sibling.sampled) == (
            TRACE_ID, PARENT, True)
        assert sibling.attributes == link.attributes
        assert traceparent(sibling) == f"00-{TRACE_ID}-{sibling.span_id}-01"
