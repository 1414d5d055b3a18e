"""The bounds on one `POST /v1/whatif` (control/api/limits.py `RequestLimits`), each checked
before the work it bounds and refused with the limit's name:

    max_whatif_proposals  proposals in the body (`set` and `compare` together): each is
                          one more replay of the whole window                        400
    max_whatif_window_s   since..until: the replay simulates every request of it. Given
                          both ends, checked before anything is read; an open end (since
                          or until None: from the first request's arrival / up to the
                          last one's end) is measured on the trace, as read_window
                          takes it (a given end stays: since=-30d is 30 days)        400
    max_whatif_waiting    predictions admitted and not yet done: reading their window or
                          queued for or running in the one predictor process          429

A prediction holds its place from admission until the predictor process has finished
(or dropped) its job, not until the client leaves: a client that disconnects does not
stop a job that is running, so its place is freed by the job's own future.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from control.api.errors import APIError
from control.api.limits import RequestLimits

RETRY_AFTER_S = 5  # about one small prediction


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def check_proposals(props: dict[str, Any], limits: RequestLimits, param: str) -> None:
    if len(props) > limits.max_whatif_proposals:
        raise _bad(f"{len(props)} proposals: at most max_whatif_proposals="
                   f"{limits.max_whatif_proposals} per request (each replays the whole"
                   " window); split them over several requests", param)


def check_window(since: float | None, until: float | None, limits: RequestLimits) -> None:
    """A window given by both ends: its length, before anything is read."""
    if since is not None and until is not None and \
            until - since > limits.max_whatif_window_s:
        raise _bad(_too_long(until - since, limits), "since")


def check_span(con: Any, since: float | None, until: float | None,
               limits: RequestLimits) -> None:
    """A window with an open end: the arrival span of the requests in it, on `con`."""
    if since is not None and until is not None:
        return  # check_window did
    lo = -1e300 if since is None else since
    hi = 1e300 if until is None else until
    # as read_window takes an open end: the first arrival, the last end (or arrival)
    first, last = con.execute("SELECT min(arrival_time), max(coalesce(finished_time,"
                              " arrival_time)) FROM requests WHERE arrival_time >= ?"
                              " AND arrival_time <= ?", [lo, hi]).fetchone()
    if first is None:
        return  # no request: read_window says what to do
    span = (last if until is None else until) - (first if since is None else since)
    if span > limits.max_whatif_window_s:
        raise _bad(_too_long(span, limits) + " (an open since/until reaches the first or"
                   " last request recorded: give both ends)", "since")


def _too_long(span_s: float, limits: RequestLimits) -> str:
    return (f"the window spans {span_s:.1f} s: at most max_whatif_window_s="
            f"{limits.max_whatif_window_s:g} s (--limit max_whatif_window_s=S)")


class Waiting:
    """Predictions admitted and not yet done, across every request of this process (there
    is one predictor process per server process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def admit(self, limits: RequestLimits) -> None:
        """Take a place, or 429 naming max_whatif_waiting; the caller must `release` it
        (directly, or by `release_when(future)` once its job is submitted)."""
        with self._lock:
            if self.count >= limits.max_whatif_waiting:
                raise APIError(429, f"{self.count} what-if predictions are already waiting"
                               f" or running: at most max_whatif_waiting="
                               f"{limits.max_whatif_waiting}; try again later",
                               code="too_many_whatifs",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            self.count += 1

    def release(self) -> None:
        with self._lock:
            self.count -= 1

    def release_when(self, future: Future) -> None:
        """Release once the predictor's job is done or cancelled (not when the request
        ends: a running job goes on after its client left)."""
        future.add_done_callback(lambda _: self.release())
