"""Deadlines of started requests: which ones passed, found in O(1) per step when none did.

A request's deadline (`X-Deadline-Ms`, `Request.deadline`) is the time by which it must be
done. Admission refuses what cannot make it (`engine/lanes/admission.py`); a request never
scheduled by then ends in its lane queue (`LaneQueue.expired`); one that started (running,
or queued again after a preemption) is tracked here, and the engine ends it at the start
of the first step past its deadline, as TIMEOUT with what it has.

The heap holds (deadline, queue_seq, request) from a request's first start; entries of
requests that finished are skipped when they reach the top (lazily), and the whole heap is
rebuilt when it holds more than twice the live entries, so its size stays bounded by the
requests in flight whatever their deadlines (up to a week).
"""

from __future__ import annotations

import heapq

from engine.request import Request

_SLACK = 64  # entries allowed over twice the live count before a rebuild (amortises it)


class DeadlineHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: Request, num_live: int) -> None:
        """Track `req` (started, with a deadline). `num_live` bounds the unfinished requests
        the heap may hold (running + queued): past twice that, finished entries go."""
        heap = self._heap
        if len(heap) > 2 * num_live + _SLACK:
            heap[:] = [entry for entry in heap if not entry[2].is_finished]
            heapq.heapify(heap)
        heapq.heappush(heap, (req.deadline, req.queue_seq, req))

    def due(self, now: float) -> list[Request]:
        """Unfinished tracked requests whose deadline is before `now`, earliest first;
        they leave the heap (the caller ends them)."""
        heap = self._heap
        out: list[Request] = []
        while heap and heap[0][0] < now:
            req = heapq.heappop(heap)[2]
            if not req.is_finished:
                out.append(req)
        return out
