"""Pauses of Python's garbage collector on /metrics: `batchpilot_gc_pause_seconds{generation}`.

A collection holds the GIL, so while it runs no engine step and no stream moves: a full
collection over a freshly loaded SmolLM2 process took ~130 ms. engine/gc_heap.py freezes
the start-up heap once the server is ready (that freeze's own collection is the first
generation-2 sample); this histogram shows what collections still cost while serving, so
an inter-token latency spike can be checked against them.
"""

from __future__ import annotations

import contextlib
import gc
import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

from prometheus_client.core import HistogramMetricFamily

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)  # seconds
GENERATIONS = (0, 1, 2)


class GcPauses:
    """Times every collection of the process (gc.callbacks) while started."""

    def __init__(self, model: str):
        self.model = model
        self._started_at = 0.0
        # per generation: counts per bucket (the last: past BUCKETS[-1]) and seconds in all
        self._counts = {g: [0] * (len(BUCKETS) + 1) for g in GENERATIONS}
        self._seconds = dict.fromkeys(GENERATIONS, 0.0)

    def start(self) -> GcPauses:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        """Inside the collector, on whichever thread set it off, with the GIL held: plain
        arithmetic on lists, no lock (the thread it interrupted may hold any lock)."""
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started_at
        generation = info.get("generation", 2)
        self._counts[generation][bisect_left(BUCKETS, seconds)] += 1
        self._seconds[generation] += seconds

    def families(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "batchpilot_gc_pause_seconds", "Python garbage collections: how long each held"
            " the GIL (no step or stream moves meanwhile), by generation.",
            labels=["model", "generation"])
        for generation in GENERATIONS:
            cumulative = list(accumulate(self._counts[generation]))
            buckets = [(str(b), c) for b, c in zip(BUCKETS, cumulative, strict=False)]
            family.add_metric([self.model, str(generation)],
                              [*buckets, ("+Inf", cumulative[-1])], self._seconds[generation])
        yield family
