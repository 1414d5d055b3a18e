"""Background threads that work in bursts: wake every so often, take everything queued.

One wake-up per burst instead of one per engine step means one GIL hand-over per burst;
releasing the GIL every few items inside a burst keeps the engine thread from waiting for
the interpreter's 5 ms switch interval when it needs the GIL back.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

YIELD_EVERY = 8  # items handled between voluntary GIL releases


def drain(q: queue.SimpleQueue, yield_every: int = YIELD_EVERY) -> Iterator[Any]:
    """Every item queued now (and any that arrive while draining), in order."""
    taken = 0
    while True:
        taken += 1
        if taken % yield_every == 0:
            time.sleep(0)  # let a waiting engine thread have the GIL now
        try:
            item = q.get_nowait()
        except queue.Empty:
            return
        yield item
