"""A live config patch's edges (engine/config/patch.py: what it keeps, what it refuses and
how) and a lane's tenant book (engine/lanes/tenants.py: where a tenant joins the fair share,
what it keeps while it runs or is preempted, and that a departed tenant leaves nothing)."""

from __future__ import annotations

import pytest

from engine.config import LiveConfig, StaticConfig
from engine.config.patch import apply_patch
from engine.lanes.tenants import TenantBook

STATIC = StaticConfig(num_kv_blocks=512, max_model_len=4096)


# ---- a live patch ----------------------------------------------------------------------
def test_a_patch_of_another_setting_keeps_every_tenants_lane_and_the_version():
    live = LiveConfig(tenant_lanes={"acme": "batch", "beta.co": "long_context"}, version=7)
    new = apply_patch(live, STATIC, {"max_num_seqs": 32})
    assert new.max_num_seqs == 32 and new.version == 7
    assert dict(new.tenant_lanes) == {"acme": "batch", "beta.co": "long_context"}
    moved = apply_patch(live, STATIC, {"tenant_lanes": {"acme": None, "new": "interactive"}})
    assert dict(moved.tenant_lanes) == {"beta.co": "long_context", "new": "interactive"}


def test_a_static_setting_is_refused_as_one_that_needs_a_restart():
    """The operator is told why (a restart), not that the key is unknown."""
    for key in ("num_kv_blocks", "max_model_len"):
        with pytest.raises(ValueError, match=f"{key}: static.*restart"):
            apply_patch(LiveConfig(), STATIC, {key: 1024})


# ---- the tenant book -------------------------------------------------------------------
def test_a_tenant_that_leaves_leaves_nothing_whichever_way_it_goes():
    book = TenantBook()
    book.queued("a", fair=True)
    book.unqueued("a", finished=True)  # cancelled while queued
    assert len(book) == 0 and not book.is_active("a")
    book.queued("b", fair=True)
    book.unqueued("b", finished=False)
    book.started("b", decoding=True)
    book.charge({"b": 10})
    book.stopped("b", decoding=True, requeued=False)
    assert len(book) == 0 and not book.is_active("b") and book.vtime_high == 10


def test_a_tenant_ahead_keeps_its_lead_while_it_runs_or_is_preempted():
    book = TenantBook()
    book.queued("a", fair=True)
    book.queued("b", fair=True)
    book.unqueued("a", finished=False)
    book.started("a", decoding=False)
    book.charge({"a": 100})
    book.queued("a", fair=True)  # a, running and 100 ahead, queues another request
    assert book.vtimes["a"] == 100 and book.vtimes["b"] == 0
    book.unqueued("a", finished=False)
    book.started("a", decoding=True)
    book.charge({"a": 50})
    book.stopped("a", decoding=True, requeued=True)  # preempted: pushed back next
    book.stopped("a", decoding=False, requeued=True)
    book.queued("a", fair=True)
    assert book.vtimes["a"] == 150


def test_a_newcomer_joins_at_the_highest_reached_when_nobody_is_queued():
    """Else it would run alone until it caught up with tenants that ran long before."""
    book = TenantBook()
    book.queued("a", fair=True)
    book.unqueued("a", finished=False)
    book.started("a", decoding=False)
    book.charge({"a": 200})
    book.queued("b", fair=True)
    assert book.vtimes["b"] == 200


def test_the_floor_rises_when_the_tenant_furthest_behind_leaves_the_queue():
    book = TenantBook()
    book.queued("a", fair=True)
    book.queued("b", fair=True)
    book.charge({"b": 100})
    assert book.queued_floor() == 0  # a, still queued, is furthest behind
    book.unqueued("a", finished=False)  # a starts: the queue holds b alone
    book.queued("c", fair=True)
    assert book.vtimes["c"] == 100  # level with b, not ahead of it


def test_a_fair_lanes_rebuilt_queue_keeps_the_virtual_times():
    book = TenantBook()
    book.queued("a", fair=True)
    book.charge({"a": 40})
    book.clear_queue(fair=True)
    assert book.vtimes == {"a": 40}
    book.clear_queue(fair=False)
    assert book.vtimes == {}
