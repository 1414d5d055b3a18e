"""Garbage-collector pauses on /metrics (control/metrics/gc_pauses.py): a collection is timed
into its generation's histogram (cumulative buckets) while the watch runs and not after; a
served process's /metrics carries the series, with the full collection it ran to freeze its
start-up heap (engine/gc_heap.py) among them."""

from __future__ import annotations

import gc

import httpx
from fixtures.serving import ServerProcess
from prometheus_client.parser import text_string_to_metric_families

from control.metrics.gc_pauses import BUCKETS, GcPauses


def _samples(watch: GcPauses) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["generation"] + s.labels.get("le", "")): s.value
            for family in watch.families() for s in family.samples}


def test_a_collection_is_timed_into_its_generation_while_started():
    watch = GcPauses("m").start()
    try:
        gc.collect(2)
    finally:
        watch.stop()
    got = _samples(watch)
    assert got[("batchpilot_gc_pause_seconds_count", "2")] >= 1
    assert got[("batchpilot_gc_pause_seconds_sum", "2")] > 0
    assert got[("batchpilot_gc_pause_seconds_bucket", "2+Inf")] == \
        got[("batchpilot_gc_pause_seconds_count", "2")]
    counted = got[("batchpilot_gc_pause_seconds_count", "2")]
    gc.collect(2)  # stopped: not counted
    assert _samples(watch)[("batchpilot_gc_pause_seconds_count", "2")] == counted
    assert watch._on_gc not in gc.callbacks


def test_a_served_process_shows_its_start_up_collection(tiny_llama_dir, tmp_path):
    config = {"serving": {"num_kv_blocks": 64, "max_num_seqs": 2}}
    with ServerProcess(tiny_llama_dir, tmp_path, config) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        text = client.get("/metrics").text
    counts = {s.labels["generation"]: s.value
              for family in text_string_to_metric_families(text)
              if family.name == "batchpilot_gc_pause_seconds"
              for s in family.samples if s.name.endswith("_count")}
    assert counts.keys() == {"0", "1", "2"}
    assert counts["2"] >= 1  # at least the one it ran to freeze its heap once loaded


def test_the_pause_buckets_are_cumulative_and_the_slow_ones_reach_inf():
    """A 30 ms and a 300 ms collection: each bucket counts the pauses up to its bound (so
    le="1.0" and +Inf hold both), as a histogram_quantile over them expects."""
    watch = GcPauses("m")
    for seconds in (0.03, 0.3):
        watch._on_gc("start", {"generation": 1})
        watch._started_at -= seconds  # as if the collection had run this long
        watch._on_gc("stop", {"generation": 1})
    got = _samples(watch)
    les = [got[("batchpilot_gc_pause_seconds_bucket", f"1{b}")] for b in BUCKETS]
    assert les == sorted(les) and les[-1] == 2
    assert got[("batchpilot_gc_pause_seconds_bucket", "10.025")] == 0
    assert got[("batchpilot_gc_pause_seconds_bucket", "10.5")] == 2
    assert got[("batchpilot_gc_pause_seconds_bucket", "1+Inf")] == 2
    assert got[("batchpilot_gc_pause_seconds_count", "1")] == 2
    assert got[("batchpilot_gc_pause_seconds_count", "0")] == 0
