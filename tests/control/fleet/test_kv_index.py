"""The ingress's KV index over kv_events replies: snapshots, batches, restarts."""

from __future__ import annotations

from control.fleet.kv_index import KVIndex

HEAD = {"enabled": True, "block_size": 16, "sharing": "tenant", "prefix_caching": True}


def test_snapshot_then_batches_then_a_restart_snapshot():
    index = KVIndex(2)
    assert index.cursor(0) == (None, 0) and not index.enabled
    index.apply(0, {**HEAD, "epoch": "a", "seq": 4, "snapshot": [1, 2, 3]})
    assert index.enabled and index.block_size == 16 and index.cursor(0) == ("a", 4)
    assert index.matches([1, 2, 9, 3]) == {0: 2, 1: 0}  # leading blocks only
    index.apply(0, {**HEAD, "epoch": "a", "seq": 6,
                    "batches": [((9,), (2,)), ((2,), ())]})  # 2 evicted, then back
    assert index.matched(0, [1, 2, 9, 3]) == 4 and index.cursor(0) == ("a", 6)
    index.apply(0, {**HEAD, "epoch": "b", "seq": 0, "snapshot": []})  # restarted, empty
    assert index.matched(0, [1]) == 0 and index.cursor(0) == ("b", 0)
    rows = index.families_data()
    assert rows[0] == {"replica_id": 0, "blocks": 0, "snapshots": 2, "batches": 2,
                       "dropped": 0}
    index.apply(1, {"enabled": False})  # a replica that publishes nothing changes nothing
    assert index.cursor(1) == (None, 0)


def test_an_evicted_block_leaves_the_index():
    """A replica's `removed` event takes the block out: the router must not send a prefix
    to a replica that no longer holds it."""
    index = KVIndex(1)
    index.apply(0, {**HEAD, "epoch": "a", "seq": 1, "snapshot": [1, 2, 3]})
    index.apply(0, {**HEAD, "epoch": "a", "seq": 2, "batches": [((), (2,))]})
    assert index.matched(0, [1, 2, 3]) == 1
    assert index.families_data()[0]["blocks"] == 2
