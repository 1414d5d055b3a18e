"""/metrics of the fleet: every replica's Prometheus text, one family each, every sample
labelled `replica="<id>"`, then the ingress's own families (routing decisions, requests in
flight, health), also per replica. Families stay contiguous (the exposition format requires
it), so Prometheus and promtool read the result as one target.

    batchpilot_fleet_routed_requests_total{replica, reason}   routing decisions (counter)
    batchpilot_fleet_inflight_requests{replica}               this ingress's calls in flight
    batchpilot_fleet_replica_healthy{replica}                 1 while its last poll said ready
    batchpilot_fleet_replica_failures_total{replica}          calls that failed under it
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry


class _Merged(Collector):
    def __init__(self, texts: Sequence[tuple[int, str]], own: Iterable[Metric]):
        self.texts, self.own = texts, list(own)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for replica_id, text in self.texts:
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = Metric(family.name, family.documentation, family.type,
                                    family.unit)
                    families[family.name] = merged
                for sample in family.samples:
                    # NOTE: the replica's own label, if it ever had one, is overwritten: the
                    # ingress knows which replica answered
                    labels = {**sample.labels, "replica": str(replica_id)}
                    merged.samples.append(sample._replace(labels=labels))
        yield from families.values()
        yield from self.own


def ingress_metrics(routed: Mapping[tuple[int, str], int], views: Sequence[Any]) -> list[Metric]:
    """The ingress's own families. `routed`: (replica id, reason) -> requests routed;
    `views`: control/fleet/loads.py ReplicaViews (replica_id, inflight, healthy, failures)."""
    decisions = CounterMetricFamily(
        "batchpilot_fleet_routed_requests", "Generation requests the ingress routed, by"
        " replica and reason (affinity, balance, random, only)", labels=["replica", "reason"])
    for (replica_id, reason), count in sorted(routed.items()):
        decisions.add_metric([str(replica_id), reason], count)
    inflight = GaugeMetricFamily(
        "batchpilot_fleet_inflight_requests", "Requests this ingress has in flight to the"
        " replica", labels=["replica"])
    healthy = GaugeMetricFamily(
        "batchpilot_fleet_replica_healthy", "1 while the replica's last load poll answered"
        " ready, else 0", labels=["replica"])
    failures = CounterMetricFamily(
        "batchpilot_fleet_replica_failures", "Calls to the replica that failed under it (it"
        " died or restarted)", labels=["replica"])
    for view in views:
        rid = [str(view.replica_id)]
        inflight.add_metric(rid, view.inflight)
        healthy.add_metric(rid, 1.0 if view.healthy else 0.0)
        failures.add_metric(rid, view.failures)
    return [decisions, inflight, healthy, failures]


def merge_metrics(texts: Sequence[tuple[int, str]], own: Iterable[Metric] = ()) -> bytes:
    """[(replica id, its /metrics text)] (+ the ingress's families) -> one exposition,
    labelled by replica."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(texts, own))
    return generate_latest(registry)
