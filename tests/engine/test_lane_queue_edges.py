"""Lane queues at their edges (engine/lanes/queues.py): where a lane that starts queueing
joins the fair share, and a live change of a lane's policy reordering its queue."""

from __future__ import annotations

from engine.config import LaneConfig
from engine.lanes.queues import LaneQueue, LaneSet
from engine.request import Request, SamplingParams


def _request(request_id: str, lane: str) -> Request:
    return Request(request_id, [3, 4, 5], SamplingParams(max_tokens=1), 0.0, lane=lane)


def test_a_lane_that_starts_queueing_joins_level_with_the_one_furthest_behind():
    """Two lanes queue at virtual times 5 and 9; a third, idle at 0, joins at 5: level with
    the one furthest behind, so it neither takes the tokens the idle time would earn nor
    waits behind the backlog of the one ahead."""
    lanes = LaneSet((LaneConfig("a"), LaneConfig("b"), LaneConfig("c"), LaneConfig("idle")))
    lanes.push(_request("qa", "a"))
    lanes.push(_request("qb", "b"))
    for name, vtime in (("a", 5.0), ("b", 9.0), ("c", 20.0)):  # as charged since
        lanes[name].vtime = vtime  # c has nothing queued: its lead does not count
    lanes.push(_request("new", "idle"))
    assert lanes["idle"].vtime == 5.0
    assert lanes.pick({}, {}).name == "a"  # ties go to config order: a, then the newcomer


def test_a_live_change_of_policy_reorders_the_queued_requests():
    """fcfs to priority while requests queue: the most urgent starts next, then the rest by
    priority, ties by arrival."""
    queue = LaneQueue(LaneConfig("only"))
    for i, priority in enumerate((3, 1, 2, 1)):
        req = _request(f"p{priority}-{i}", "only")
        req.priority, req.arrival_time = priority, float(i)
        queue.push(req)
    assert queue.peek().request_id == "p3-0"
    queue.reconfigure(LaneConfig("only", policy="priority"))
    order = []
    while (head := queue.peek()) is not None:
        queue.pop(head)
        order.append(head.request_id)
    assert order == ["p1-1", "p1-3", "p2-2", "p3-0"]
    assert queue.num_waiting == 0 and not queue.buckets()
