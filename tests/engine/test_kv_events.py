"""The KV event log's bounds: a reader that keeps up gets every batch in order; one that
falls behind gets None (take a snapshot) and the batches it missed count as dropped."""

from __future__ import annotations

import pytest

from engine.kv.events import KVEventLog


def test_a_reader_that_keeps_up_sees_every_batch_in_order():
    log = KVEventLog(capacity=2)
    assert log.since(0) == []
    log.seal(step_id=1)  # a step with no events makes no batch
    assert log.seq == 0
    log.stored(11)
    log.stored(12)
    log.seal(step_id=2)
    log.removed(11)
    log.seal(step_id=3)
    first, second = log.since(0)
    assert (first.seq, first.step_id, first.stored, first.removed) == (1, 2, (11, 12), ())
    assert (second.seq, second.stored, second.removed) == (2, (), (11,))
    assert log.since(2) == [] and log.since(1) == [second]
    log.stored(13)
    log.seal(step_id=4)  # batch 1 leaves the ring, but it was read: not dropped
    assert log.counters() == {"seq": 3, "dropped": 0, "gaps": 0}


def test_a_reader_that_falls_behind_gets_a_gap_and_the_lost_batches_count():
    log = KVEventLog(capacity=2)
    for step in range(1, 6):
        log.stored(step)
        log.seal(step)
    assert log.since(0) is None  # batches 1..3 are gone
    assert log.since(2) is None
    assert [b.seq for b in log.since(3)] == [4, 5]
    assert log.since(99) is None  # a cursor from another process's log
    assert log.counters() == {"seq": 5, "dropped": 3, "gaps": 3}
    with pytest.raises(ValueError):
        KVEventLog(capacity=0)


def test_a_batch_given_to_a_reader_never_counts_as_dropped():
    """`dropped` counts the batches that left the ring before any reader had them: a
    reader that reads each batch as it comes loses none, however many leave the ring."""
    log = KVEventLog(capacity=1)
    for step in range(1, 5):
        log.stored(step)
        log.seal(step)  # the batch before this one leaves the ring, read
        (batch,) = log.since(step - 1)
        assert batch.seq == step
    assert log.counters() == {"seq": 4, "dropped": 0, "gaps": 0}
    log.stored(5)
    log.seal(5)
    log.stored(6)
    log.seal(6)  # batch 5 left unread
    assert log.counters()["dropped"] == 1


def test_listeners_hear_each_sealed_batch_until_they_stop():
    log, heard = KVEventLog(), []
    listener = lambda: heard.append(log.seq)  # noqa: E731
    log.listen(listener)
    log.seal(1)  # no events: no batch, nothing to hear
    log.stored(7)
    log.seal(2)
    log.removed(7)
    log.seal(3)
    log.unlisten(listener)
    log.stored(8)
    log.seal(4)
    assert heard == [1, 2] and log.seq == 3
