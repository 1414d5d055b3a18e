"""KV events: which prefix-cache blocks became findable and which stopped being, step by
step, for a router that places requests where their prefix really is (control/fleet/
kv_index.py). Keys are the BlockManager's keyed chained digests (engine/kv/prefix_hash.py):
the log holds no token or text, and without the hash key nobody can tell what a key is.

    stored   a full block was registered in the cache (a request can hit it from now on)
    removed  it was evicted (a request can no longer hit it)

A block that is in use and findable stays "stored" until evicted: a router only asks
whether a replica holds the prefix, not whether it is free.

The engine thread writes (`stored`, `removed`, and `seal` once per step); readers on other
threads call `since`. Bounded: the last `capacity` sealed batches are kept, and a reader
that falls further behind gets None (a gap) and must take a full snapshot instead; each
batch that left the ring before any reader saw it counts in `dropped`. Nothing here blocks
or slows a step beyond appending ints to two lists, and, while a reader waits for the next
batch (a long poll: control/fleet/replica.py), calling its listener once per sealed batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CAPACITY = 512  # sealed batches kept for readers (~0.5-5 s of steps)


@dataclass(frozen=True)
class KVEventBatch:
    """One step's events. `seq` counts sealed batches from 1 with no holes."""

    seq: int
    step_id: int
    stored: tuple[int, ...]
    removed: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"seq": self.seq, "step_id": self.step_id, "stored": list(self.stored),
                "removed": list(self.removed)}


class KVEventLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be >= 1")
        self._ring: deque[KVEventBatch] = deque(maxlen=capacity)
        self._lock = threading.Lock()  # the ring and the counters; pending lists: engine only
        self._stored: list[int] = []
        self._removed: list[int] = []
        self.seq = 0  # the last sealed batch's
        self.read_seq = 0  # the highest seq any reader has been given
        self.dropped = 0  # batches that left the ring unread
        self.gaps = 0  # reads answered None: the reader must take a snapshot
        # called on the engine thread after each sealed batch; they must not block or raise
        self._listeners: tuple[Callable[[], None], ...] = ()

    # ---- the engine thread -----------------------------------------------------------
    def stored(self, key: int) -> None:
        self._stored.append(key)

    def removed(self, key: int) -> None:
        self._removed.append(key)

    def seal(self, step_id: int) -> None:
        """End of a step: its events (if any) become one batch readers can see."""
        if not (self._stored or self._removed):
            return
        with self._lock:
            self.seq += 1
            ring = self._ring
            if len(ring) == ring.maxlen and ring[0].seq > self.read_seq:
                self.dropped += 1
            ring.append(KVEventBatch(self.seq, step_id, tuple(self._stored),
                                     tuple(self._removed)))
        self._stored.clear()
        self._removed.clear()
        for listener in self._listeners:
            listener()

    # ---- readers ---------------------------------------------------------------------
    def listen(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each batch is sealed, until `unlisten` (any thread)."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners = tuple(cb for cb in self._listeners if cb is not listener)

    def since(self, seq: int) -> list[KVEventBatch] | None:
        """Sealed batches after `seq` in order, or None when some of them already left
        the ring (the reader missed events: it needs a snapshot)."""
        with self._lock:
            if seq > self.seq:
                self.gaps += 1
                return None  # a seq from another log (the reader's state is not ours)
            batches = [b for b in self._ring if b.seq > seq]
            if (batches[0].seq if batches else self.seq + 1) != seq + 1:
                self.gaps += 1
                return None
            self.read_seq = max(self.read_seq, self.seq)
            return batches

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"seq": self.seq, "dropped": self.dropped, "gaps": self.gaps}
