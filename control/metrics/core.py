"""Lock-free metric primitives the engine thread writes and a scrape reads.

prometheus-client's own Histogram takes a lock and scans its buckets on every observe;
the engine thread observes several values per step and one per output token (inter-token
latency), so these keep plain lists instead. Only the engine thread writes; a scrape
copies the lists (atomic under the GIL), and derives each count from the bucket counts,
so the cumulative buckets and the +Inf bucket always agree.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from engine.calibration.drift import StepCostDrift

# Upper bounds (seconds, or tokens for the step sizes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                   40.0, 80.0, 160.0, 320.0, 640.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15,
                         0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0)
TOKEN_COUNT_BUCKETS = tuple(float(2 ** i) for i in range(15))  # 1 .. 16384


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum", "exemplars")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0
        # per bucket, the last traced observation in it: (trace id, value, time); None
        # until one is (OpenMetrics exemplars: a panel's point links to a trace)
        self.exemplars: list[tuple[str, float, float] | None] | None = None

    def observe(self, value: float, trace_id: str | None = None, at: float = 0.0) -> None:
        i = bisect_left(self.bounds, value)
        self.counts[i] += 1
        self.sum += value
        if trace_id:
            if self.exemplars is None:
                self.exemplars = [None] * len(self.counts)
            self.exemplars[i] = (trace_id, value, at)

    def observe_gaps(self, times: tuple[float, ...]) -> None:
        """Observe every gap between consecutive times (a request's inter-token latencies),
        in one pass (faster here than numpy for the usual tens to thousands of values)."""
        counts, bounds = self.counts, self.bounds
        prev = times[0]
        for t in times[1:]:
            counts[bisect_left(bounds, t - prev)] += 1
            prev = t
        self.sum += times[-1] - times[0]


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Family:
    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...],
                 make: Callable[[], Any]):
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self._make = make
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._make()
        return child


class Histogram(_Family):
    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...],
                 buckets: tuple[float, ...]):
        super().__init__(name, doc, labelnames, lambda: HistogramChild(buckets))
        self.buckets = buckets
        # which exemplars the exposition writes, by trace id (None: all): with an OTLP
        # export, those of traces the collector took (control/otel/export.py)
        self.shows: Callable[[str], bool] | None = None

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for labels, child in list(self.children.items()):
            counts, total = list(child.counts), child.sum
            marks = list(child.exemplars or ())
            if marks and self.shows is not None:
                marks = [m if m is not None and self.shows(m[0]) else None for m in marks]
            cumulative, acc = [], 0
            for i, (bound, n) in enumerate(zip(self.buckets, counts, strict=False)):
                acc += n
                cumulative.append(_bucket(_le(bound), acc, marks[i] if marks else None))
            cumulative.append(_bucket("+Inf", acc + counts[-1], marks[-1] if marks else None))
            fam.add_metric(list(labels), cumulative, total)
        return fam


class Counter(_Family):
    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...]):
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        super().__init__(name, doc, labelnames, CounterChild)

    def family(self) -> CounterMetricFamily:
        fam = CounterMetricFamily(self.name.removesuffix("_total"), self.doc,
                                  labels=self.labelnames)
        for labels, child in list(self.children.items()):
            fam.add_metric(list(labels), child.value)
        return fam


class FamiliesCollector(Collector):
    """Exposes Histogram and Counter families; `extra` yields families built at scrape."""

    def __init__(self, families: list[_Family],
                 extra: list[Callable[[], Iterator[Any]]] | None = None):
        self.families = families
        self.extra = extra or []

    def collect(self) -> Iterator[Any]:
        for family in self.families:
            yield family.family()
        for source in self.extra:
            yield from source()


def _bucket(le: str, count: int, mark: tuple[str, float, float] | None) -> tuple:
    """A cumulative bucket, with its exemplar when it has one (prometheus-client writes
    exemplars only in the OpenMetrics format a scraper asks for)."""
    if mark is None:
        return (le, count)
    trace_id, value, at = mark
    return (le, count, Exemplar({"trace_id": trace_id}, value, at or None))


def _le(bound: float) -> str:
    return repr(float(bound))


def step_cost_families(cost: StepCostDrift, model: str) -> Iterator[GaugeMetricFamily]:
    """The step law's standing (engine/calibration/drift.py). The drift is NaN until the
    server has evidence (its first steps, and steps in the last 20 s): unknown, not 1,
    and the series exists wherever there is a law, so boards and checks find it."""
    drift = cost.drift if cost.drift is not None else math.nan
    for name, doc, value in (
        ("step_law_scale", "Measured / predicted step time the scheduler divides the step"
         " target by (its online correction of the law).", cost.law_scale),
        ("step_cost_drift_ratio", "Served steps' measured / predicted time over the last"
         " 20 s (median), over the same at start-up: 2 means the device got twice as slow"
         " (NaN: not enough recent steps to tell).", drift),
    ):
        fam = GaugeMetricFamily("batchpilot_" + name, doc, labels=["model"])
        fam.add_metric([model], float(value))
        yield fam
    refits = CounterMetricFamily(
        "batchpilot_step_law_refits", "Online refits of the step law from served steps"
        " (every 64 steps), by whether the refit replaced the law (its shape fitted the"
        " served steps better than a rescale of the law did).", labels=["model", "adopted"])
    refits.add_metric([model, "true"], cost.law_adopted)
    refits.add_metric([model, "false"], cost.law_refits - cost.law_adopted)
    yield refits
    if cost.threads is not None:  # a CPU model's steps (engine/calibration/thread_governor.py)
        threads = GaugeMetricFamily(
            "batchpilot_step_threads", "Threads a CPU model's steps run on: all the server"
            " took at start, or one while another process holds a core.", labels=["model"])
        threads.add_metric([model], cost.threads)
        yield threads
        switches = CounterMetricFamily(
            "batchpilot_step_thread_switches", "Changes of the steps' thread count, each"
            " after a trial of the other count beat the one in force.", labels=["model"])
        switches.add_metric([model], cost.thread_switches)
        yield switches
