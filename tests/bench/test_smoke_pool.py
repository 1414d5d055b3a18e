"""The smokes' pool (smoke_pool.py): two jobs at a time, one per exclusive group, and no
job started once the session has closed it."""

from __future__ import annotations

import threading
import time

from smoke_pool import EXCLUSIVE, SmokePool


def test_two_at_a_time_one_per_exclusive_group_and_nothing_after_close():
    started: list[str] = []
    release = threading.Event()

    def job(name: str):
        def run() -> str:
            started.append(name)
            release.wait(10)
            return name
        return run

    ray_jobs = [n for n in EXCLUSIVE if n.startswith("smoke:")][:2]
    names = [*ray_jobs, "plain-1", "plain-2"]
    pool = SmokePool({name: job(name) for name in names})
    deadline = time.monotonic() + 10
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    # the two Ray smokes share a group: one of them and a plain job run, never both Rays
    assert len(started) == 2 and sum(n in ray_jobs for n in started) == 1
    pool.close()
    release.set()
    assert pool.result(started[0]) == started[0] and pool.result(started[1]) == started[1]
    time.sleep(0.2)
    assert len(started) == 2  # closed: the other two never start
