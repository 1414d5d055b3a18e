"""What gateways and routers read from /metrics (docs/gateways.md), built at each scrape
from ServingMetrics, so nothing more is written per step.

Always: `batchpilot_kv_cache_config_info{model, block_size, num_gpu_blocks}` = 1, the KV
pool's shape for an endpoint picker's prefix-cache scorer (the picker reads the two labels,
as it does vLLM's `vllm:cache_config_info`). The totals it balances on are in registry.py:
`batchpilot_num_requests_waiting`, `batchpilot_num_requests_running`,
`batchpilot_kv_usage_ratio`.

With `--metrics-compat vllm`, also the same values under vLLM's names, for tools that read
only those (vLLM's production-stack router, an endpoint picker or dashboard left at its vLLM
defaults): labels `model_name` and `engine="0"` as vLLM V1 sets them; histograms and
counters summed over lanes and tenants (vLLM has neither); buckets are ours (a quantile
query does not care). Off by default: a dashboard summing over both names would count
everything twice. Names are those of vLLM's `v1/metrics/loggers.py` (2026 main), plus
the two older names vLLM's production-stack router still reads (`vllm:gpu_cache_usage_perc`,
`vllm:gpu_prefix_cache_{queries,hits}_total`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from control.metrics.core import Counter, Histogram
from control.metrics.genai import GenAIServerMetrics
from control.metrics.registry import ServingMetrics
from control.serve.settings import COMPAT_MODES
from engine.config import StaticConfig

VLLM_LABELS = ["model_name", "engine"]
ENGINE = "0"  # vLLM's engine index; one engine per batchpilot server
REQUEST_HISTOGRAMS = (  # (vLLM name, doc, ServingMetrics.latency key)
    ("vllm:time_to_first_token_seconds", "Arrival to first output token.", "ttft_s"),
    ("vllm:e2e_request_latency_seconds", "Arrival to end.", "e2e_s"),
    ("vllm:request_queue_time_seconds", "Arrival to first scheduled step.", "queue_delay_s"),
    ("vllm:request_prefill_time_seconds", "First scheduled step to first token.",
     "prefill_time_s"),
    ("vllm:request_decode_time_seconds", "First token to last token.", "decode_time_s"),
    ("vllm:request_time_per_output_token_seconds", "Mean time per output token after the"
     " first, per request.", "tpot_s"),
)
# (outcome, our reason) -> vLLM's finished_reason; rejected requests never reach vLLM's
# engine, so they have none
FINISHED_REASONS = ("stop", "length", "abort", "error")
OUTCOME_REASON = {"cancelled": "abort", "timeout": "abort", "error": "error"}

StaticSource = Callable[[], StaticConfig | None]


def install_gateway_metrics(metrics: ServingMetrics, static: StaticSource,
                            compat: str | None) -> None:
    """Add the cache-info family, and with compat "vllm" the vLLM-named ones (with "otel"
    the OpenTelemetry GenAI histograms), to /metrics.
    `static`: the loaded engine's static config, None while the model loads."""
    if compat is not None and compat not in COMPAT_MODES:
        raise ValueError(f"metrics_compat={compat!r} must be one of {COMPAT_MODES} or None")
    metrics.add_source(lambda: cache_info_families(metrics.model, static()))
    if compat == "vllm":
        metrics.add_source(lambda: vllm_families(metrics, static()))
    elif compat == "otel":
        genai = GenAIServerMetrics(metrics.model, metrics.exemplar_shown)
        metrics.request_observers.append(genai.observe)
        metrics.add_source(genai.families)


def cache_info_families(model: str, static: StaticConfig | None) -> Iterator[Any]:
    if static is None:
        return
    fam = GaugeMetricFamily("batchpilot_kv_cache_config_info", "The KV pool's shape (value"
                            " 1): tokens per block, blocks.",
                            labels=["model", "block_size", "num_gpu_blocks"])
    fam.add_metric([model, str(static.block_size), str(static.num_kv_blocks)], 1.0)
    yield fam


def vllm_families(m: ServingMetrics, static: StaticConfig | None) -> Iterator[Any]:
    """Every vLLM-named family; gauges only once the engine has reported its state."""
    key = [m.model, ENGINE]
    yield from _gauges(m, key, static)
    for name, doc, attr in REQUEST_HISTOGRAMS:
        yield merged_histogram(name, doc, m.latency[attr], key)
    yield merged_histogram("vllm:inter_token_latency_seconds", "Time between consecutive"
                           " output tokens of a request.", m.itl, key)
    for name, doc, family in (
        ("vllm:prompt_tokens", "Prompt tokens of ended requests.", m.prompt_tokens),
        ("vllm:generation_tokens", "Output tokens of ended requests.", m.generation_tokens),
        ("vllm:num_preemptions", "Requests preempted.", m.preemptions),
        ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
         m.prefix_queries),
        ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", m.prefix_hits),
        ("vllm:gpu_prefix_cache_queries", "Older name of vllm:prefix_cache_queries.",
         m.prefix_queries),
        ("vllm:gpu_prefix_cache_hits", "Older name of vllm:prefix_cache_hits.",
         m.prefix_hits),
    ):
        fam = CounterMetricFamily(name, doc, labels=VLLM_LABELS)
        fam.add_metric(key, summed(family))
        yield fam
    yield _request_success(m, key)


def _gauges(m: ServingMetrics, key: list[str], static: StaticConfig | None,
            ) -> Iterator[GaugeMetricFamily]:
    g = m.gauges
    if g is None:
        return
    for name, doc, value in (
        ("vllm:num_requests_running", "Requests running, all lanes.",
         sum(g.running_by_lane.values())),
        ("vllm:num_requests_waiting", "Requests queued, all lanes.",
         sum(g.waiting_by_lane.values())),
        ("vllm:kv_cache_usage_perc", "KV-cache usage (a ratio: 1 means all blocks used).",
         g.kv_usage),
        ("vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc.", g.kv_usage),
    ):
        fam = GaugeMetricFamily(name, doc, labels=VLLM_LABELS)
        fam.add_metric(key, float(value))
        yield fam
    if static is not None:  # vLLM's info gauge: labels only, no model_name
        fam = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration.",
                                labels=["block_size", "num_gpu_blocks",
                                        "enable_prefix_caching", "engine"])
        fam.add_metric([str(static.block_size), str(static.num_kv_blocks),
                        str(static.enable_prefix_caching), ENGINE], 1.0)  # "True" / "False"
        yield fam


def _request_success(m: ServingMetrics, key: list[str]) -> CounterMetricFamily:
    counts = dict.fromkeys(FINISHED_REASONS, 0.0)
    for labels, child in list(m.requests.children.items()):
        outcome, reason = labels[-2], labels[-1]
        if outcome == "finished":
            counts["length" if reason == "length" else "stop"] += child.value
        elif outcome in OUTCOME_REASON:
            counts[OUTCOME_REASON[outcome]] += child.value
    fam = CounterMetricFamily("vllm:request_success", "Requests ended, by vLLM's finish"
                              " reason (rejected ones excluded).",
                              labels=[*VLLM_LABELS, "finished_reason"])
    for reason, value in counts.items():
        fam.add_metric([*key, reason], value)
    return fam


def summed(family: Counter) -> float:
    """A counter's total over all its series (lanes, tenants)."""
    return sum(child.value for child in list(family.children.values()))


def merged_histogram(name: str, doc: str, family: Histogram, key: list[str],
                     ) -> HistogramMetricFamily:
    """`family`'s series (lanes, tenants) added bucket by bucket into one."""
    counts = [0] * (len(family.buckets) + 1)
    total = 0.0
    for child in list(family.children.values()):
        for i, n in enumerate(list(child.counts)):
            counts[i] += n
        total += child.sum
    cumulative, acc = [], 0
    for bound, n in zip(family.buckets, counts, strict=False):
        acc += n
        cumulative.append((repr(float(bound)), acc))
    cumulative.append(("+Inf", acc + counts[-1]))
    fam = HistogramMetricFamily(name, doc, labels=VLLM_LABELS)
    fam.add_metric(key, cumulative, total)
    return fam
