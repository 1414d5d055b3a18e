"""/metrics of the fleet: every replica's Prometheus text, one family each, every sample
labelled `replica="<id>"`. Families stay contiguous (the exposition format requires it), so
Prometheus and promtool read the result as one target.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry


class _Merged(Collector):
    def __init__(self, texts: Sequence[tuple[int, str]]):
        self.texts = texts

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
                    labels = {**sample.labels, "replica": str(replica_id)}
                    merged.samples.append(sample._replace(labels=labels))
        yield from families.values()


def merge_metrics(texts: Sequence[tuple[int, str]]) -> bytes:
    """[(replica id, its /metrics text)] -> one exposition, labelled by replica."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(texts))
    return generate_latest(registry)
