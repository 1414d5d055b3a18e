"""/metrics of the fleet: every replica's Prometheus text, one family each, every sample
labelled `replica="<id>"`, then the ingress's own families (routing decisions, requests in
flight, health), also per replica. Families stay contiguous (the exposition format requires
it), so Prometheus and promtool read the result as one target.

    batchpilot_fleet_routed_requests_total{replica, reason}   routing decisions (counter)
    batchpilot_fleet_inflight_requests{replica}               this ingress's calls in flight
    batchpilot_fleet_replica_healthy{replica}                 1 while its last poll said ready
    batchpilot_fleet_replica_failures_total{replica}          calls that failed under it
  with --routing precise (control/fleet/kv_index.py):
    batchpilot_fleet_routed_matched_blocks_total{replica}     prompt blocks it held when
                                                              routed there (sum; / routed)
    batchpilot_fleet_kv_index_blocks{replica}                 blocks the index says it holds
    batchpilot_fleet_kv_index_reads_total{replica, kind}      snapshot | batch applied
    batchpilot_fleet_kv_events_dropped_total{replica}         event batches it dropped unread
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
        " replica and reason (precise, affinity, balance, random, only)",
        labels=["replica", "reason"])
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


def kv_index_metrics(matched: Mapping[int, int], index: Sequence[dict[str, Any]],
                     ) -> list[Metric]:
    """`matched`: replica id -> prompt blocks it held, summed over the requests routed to
    it; `index`: KVIndex.families_data()."""
    blocks_routed = CounterMetricFamily(
        "batchpilot_fleet_routed_matched_blocks", "Leading prompt blocks the replica held"
        " (by the ingress's KV index) when a request was routed to it, summed",
        labels=["replica"])
    for replica_id, count in sorted(matched.items()):
        blocks_routed.add_metric([str(replica_id)], count)
    held = GaugeMetricFamily(
        "batchpilot_fleet_kv_index_blocks", "Prefix-cache blocks the ingress's KV index says"
        " the replica holds", labels=["replica"])
    reads = CounterMetricFamily(
        "batchpilot_fleet_kv_index_reads", "KV event reads applied: snapshot (first read,"
        " restart, or the reader fell behind) or batch (one step's events)",
        labels=["replica", "kind"])
    dropped = CounterMetricFamily(
        "batchpilot_fleet_kv_events_dropped", "KV event batches the replica dropped before"
        " the ingress read them (a snapshot follows)", labels=["replica"])
    for row in index:
        rid = str(row["replica_id"])
        held.add_metric([rid], row["blocks"])
        reads.add_metric([rid, "snapshot"], row["snapshots"])
        reads.add_metric([rid, "batch"], row["batches"])
        dropped.add_metric([rid], row["dropped"])
    return [blocks_routed, held, reads, dropped]


def merge_metrics(texts: Sequence[tuple[int, str]], own: Iterable[Metric] = ()) -> bytes:
    """[(replica id, its /metrics text)] (+ the ingress's families) -> one exposition,
    labelled by replica."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(texts, own))
    return generate_latest(registry)
