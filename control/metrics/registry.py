"""Prometheus metrics, computed from the engine's plain records (the engine imports none).

The engine thread calls `observe(step_output)` after each step and `set_gauges` after
each step or command; /metrics renders the registry. Names start with `batchpilot_`,
times are seconds, counters end in `_total`. Labels: model on every metric; lane and
tenant where a request is known. Lanes outside the live config's lanes (as of the last
`set_gauges`: lanes come and go through the control API), tenants outside `tenants` and
reasons outside the known set are all counted as "other", so a client cannot create series.

Series whose labels are known in advance start at 0, so the first increment shows in a
rate(): the model's step, preemption, config-change and error counters at construction, and
per configured lane (the default tenant only) each outcome under its usual reason, both
admission decisions and the request histograms, the first time a config names the lane.

Counters of requests and their tokens move when a request ends (they match the trace's
`requests` table); `batchpilot_scheduled_tokens_total` moves every step (live throughput).
Inter-token latencies are observed when a request ends, one per output token gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics

from control.metrics.core import (
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    Counter,
    FamiliesCollector,
    Histogram,
    step_cost_families,
)
from engine.records import AdmissionDecision, EngineGauges, RequestRecord, StepRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
WAIT_REASONS = ("token_budget", "max_num_seqs", "kv_high_watermark", "kv_blocks",
                "step_time", "lane_max_running", "static_batch", "fair_share", "not_yet_scheduled",
                "sibling_prefill", "slo_deferred")
# End and rejection reasons a label may carry (slugs of finish details); others: "other".
REASONS = frozenset({
    "stop", "length", "stop_string", "client_disconnected", "request_timeout",
    "stream_idle_timeout", "server_shutting_down", "engine_error", "queue_timeout",
    "deadline_passed_while_queued", "deadline_passed_while_running", "queue_full", "deadline",
    "kv_reject_watermark", "slo_unreachable", "slo_deferred",
    "too_long", "empty_prompt", "unknown_lane", "draining", "admission_paused", "cancelled",
    "timeout", "error", "step_failed",
    "operator", "choice_rejected",
})
# The reasons each outcome starts at 0 with (its usual ones; panels sum over reasons).
OUTCOME_REASONS = {"finished": ("stop", "length"), "cancelled": ("client_disconnected",),
                   "timeout": ("request_timeout",), "rejected": ("queue_full",),
                   "error": ("step_failed",)}
DEFAULT_TENANT = "default"
REQUEST_LATENCIES = (  # (name, doc, RequestRecord attribute, buckets)
    ("time_to_first_token_seconds", "Arrival to first output token.", "ttft_s",
     LATENCY_BUCKETS),
    ("time_per_output_token_seconds", "Mean time per output token after the first.",
     "tpot_s", TOKEN_LATENCY_BUCKETS),
    ("e2e_request_latency_seconds", "Arrival to end (rejected requests excluded).", "e2e_s",
     LATENCY_BUCKETS),
    ("queue_delay_seconds", "Arrival to first scheduled step.", "queue_delay_s",
     LATENCY_BUCKETS),
    ("prefill_time_seconds", "First scheduled step to first token.", "prefill_time_s",
     LATENCY_BUCKETS),
    ("decode_time_seconds", "First token to last token.", "decode_time_s", LATENCY_BUCKETS),
)


def reason_label(text: str) -> str:
    """A reason's label: the slug of the text before any colon (a detail may say more
    after it: "step failed: execute raised OutOfMemoryError" -> step_failed)."""
    slug = re.sub(r"[^a-z0-9]+", "_", text.split(":", 1)[0].lower()).strip("_")
    return slug if slug in REASONS else OTHER


def caller_traced(rec: RequestRecord) -> bool:
    """Exemplar rule without an OTLP export: the caller's sampled trace, which its own
    tracing holds (the server exports none of its own)."""
    return rec.trace is not None and rec.trace.sampled


class ServingMetrics:
    def __init__(self, model: str, tenants: Iterable[str] = (),
                 exemplar_filter: Callable[[RequestRecord], bool] = caller_traced,
                 exemplar_shown: Callable[[str], bool] | None = None):
        """`exemplar_filter(record)`: whether the request's trace id goes on the latency
        histograms as an exemplar (a trace that exists: control/otel/feed.py's `keep`);
        `exemplar_shown(trace_id)`, where given: whether /metrics writes it yet (the
        collector took its spans: OtelFeed.delivered; None: at once)."""
        self.model = model
        self.exemplar_filter = exemplar_filter
        self.exemplar_shown = exemplar_shown
        self.tenants = frozenset(tenants) | {DEFAULT_TENANT}
        self.registry = CollectorRegistry(auto_describe=False)
        lt = ("model", "lane", "tenant")
        p = "batchpilot_"
        self.latency = {attr: Histogram(p + name, doc, lt, buckets)
                        for name, doc, attr, buckets in REQUEST_LATENCIES}
        for hist in self.latency.values():
            hist.shows = exemplar_shown
        self.itl = Histogram(p + "inter_token_latency_seconds",
                             "Time between consecutive output tokens of a request.", lt,
                             TOKEN_LATENCY_BUCKETS)
        self.step_duration = Histogram(p + "step_duration_seconds",
                                       "One engine step: schedule + execute + update.",
                                       ("model",), STEP_BUCKETS)
        self.step_tokens = Histogram(p + "step_tokens", "Tokens computed in one step.",
                                     ("model", "kind"), TOKEN_COUNT_BUCKETS)
        self.requests = Counter(p + "requests_total", "Requests ended, by outcome and reason.",
                                lt + ("outcome", "reason"))
        self.prompt_tokens = Counter(p + "prompt_tokens_total",
                                     "Prompt tokens of ended requests.", lt)
        self.generation_tokens = Counter(p + "generation_tokens_total",
                                         "Output tokens of ended requests.", lt)
        self.scheduled_tokens = Counter(p + "scheduled_tokens_total",
                                        "Tokens computed by the engine, every step.",
                                        ("model", "kind"))
        self.steps = Counter(p + "engine_steps_total", "Engine steps run.", ("model",))
        self.preemptions = Counter(p + "preemptions_total", "Requests preempted.", ("model",))
        self.prefix_queries = Counter(p + "prefix_cache_queries_total",
                                      "Prompt tokens looked up in the prefix cache.",
                                      ("model",))
        self.prefix_hits = Counter(p + "prefix_cache_hits_total",
                                   "Prompt tokens found in the prefix cache.", ("model",))
        self.admissions = Counter(p + "admission_decisions_total",
                                  "Admission decisions, by decision and reason.",
                                  lt + ("decision", "reason"))
        self.config_changes = Counter(p + "config_changes_total",
                                      "Live config snapshots installed after the first.",
                                      ("model",))
        self.observer_errors = Counter(p + "observer_errors_total",
                                       "Failures while recording metrics or traces (the"
                                       " engine went on).", ("model",))
        families = [*self.latency.values(), self.itl, self.step_duration, self.step_tokens,
                    self.requests, self.prompt_tokens, self.generation_tokens,
                    self.scheduled_tokens, self.steps, self.preemptions, self.prefix_queries,
                    self.prefix_hits, self.admissions, self.config_changes,
                    self.observer_errors]
        self._gauges: EngineGauges | None = None
        self._config_version: int | None = None
        self._lanes: frozenset[str] = frozenset()  # the live config's, as last seen
        self._zeroed_lanes: set[str] = set()
        self._zero_model_series()
        self._sources: list[Callable[[], Iterator[Any]]] = [self._gauge_families]
        # more views of each ended request, e.g. --metrics-compat otel's GenAI histograms:
        # observe(record, its exemplar trace id or None), on the metrics thread
        self.request_observers: list[Callable[[RequestRecord, str | None], None]] = []
        self.registry.register(FamiliesCollector(families, self._sources))

    def tenant(self, tenant: str) -> str:
        return tenant if tenant in self.tenants else OTHER

    def lane(self, lane: str, reason: str | None = None) -> str:
        """The lane label: the lane while the live config has it, else "other". A request
        refused for an unknown lane stays "other" even when a config adding that lane has
        reached this thread first (the step reporting the refusal may come after it)."""
        return lane if lane in self._lanes and reason != "unknown_lane" else OTHER

    def add_source(self, source: Callable[[], Iterator[Any]]) -> None:
        """Families built at each scrape (e.g. the trace writer's counts)."""
        self._sources.append(source)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(the exposition, its content type): OpenMetrics (with exemplars) when `accept`
        (the scraper's Accept header) asks for it, else Prometheus text 0.0.4."""
        if accept and "application/openmetrics-text" in accept:
            return openmetrics.generate_latest(self.registry), openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE

    @property
    def gauges(self) -> EngineGauges | None:
        """The engine's state as of the last `set_gauges` (None before any)."""
        return self._gauges

    # ---- the engine thread ---------------------------------------------------------------
    def observe_step(self, r: StepRecord) -> None:
        m = self.model
        self.steps.labels(m).inc()
        self.step_duration.labels(m).observe(r.duration_s)
        if r.num_prefill_tokens:
            self.step_tokens.labels(m, "prefill").observe(r.num_prefill_tokens)
            self.scheduled_tokens.labels(m, "prefill").inc(r.num_prefill_tokens)
        if r.num_decode_tokens:
            self.step_tokens.labels(m, "decode").observe(r.num_decode_tokens)
            self.scheduled_tokens.labels(m, "decode").inc(r.num_decode_tokens)
        if r.decisions.preempted:
            self.preemptions.labels(m).inc(len(r.decisions.preempted))
        if r.prefix_query_tokens:
            self.prefix_queries.labels(m).inc(r.prefix_query_tokens)
            self.prefix_hits.labels(m).inc(r.prefix_hit_tokens)

    def observe_request(self, r: RequestRecord) -> None:
        outcome = r.outcome
        reason = reason_label(r.finish_reason if outcome == "finished"
                              else r.finish_detail or r.finish_reason)
        key = (self.model, self.lane(r.lane, reason), self.tenant(r.tenant))
        self.requests.labels(*key, outcome, reason).inc()
        self.prompt_tokens.labels(*key).inc(r.num_prompt_tokens)
        self.generation_tokens.labels(*key).inc(r.num_output_tokens)
        trace_id = r.trace.trace_id if r.trace is not None and self.exemplar_filter(r) else None
        at = r.finished_time or 0.0
        for attr, hist in self.latency.items():
            value = getattr(r, attr)
            if value is not None and not (attr == "e2e_s" and outcome == "rejected"):
                hist.labels(*key).observe(value, trace_id, at)
        if len(r.token_times) > 1:  # every gap between consecutive output tokens
            self.itl.labels(*key).observe_gaps(r.token_times)
        for observe in self.request_observers:
            observe(r, trace_id)

    def observe_admission(self, d: AdmissionDecision) -> None:
        decision = "admitted" if d.accepted else "rejected"
        reason = reason_label(d.reason) if d.reason else "none"  # admitted: slo_deferred
        self.admissions.labels(self.model, self.lane(d.lane, d.reason), self.tenant(d.tenant),
                               decision, reason).inc()

    def set_gauges(self, gauges: EngineGauges) -> None:
        version = gauges.live.version
        if self._config_version is not None and version > self._config_version:
            self.config_changes.labels(self.model).inc(version - self._config_version)
        self._config_version = version
        names = gauges.live.lane_names
        for lane in names:
            if lane not in self._zeroed_lanes:
                self._zero_lane_series(lane)
        self._lanes = frozenset(names)
        self._gauges = gauges

    # ---- series at 0 (labels() creates a child at 0) ---------------------------------------
    def _zero_model_series(self) -> None:
        m = self.model
        for family in (self.steps, self.preemptions, self.prefix_queries, self.prefix_hits,
                       self.config_changes, self.observer_errors, self.step_duration):
            family.labels(m)
        for kind in ("prefill", "decode"):
            self.step_tokens.labels(m, kind)
            self.scheduled_tokens.labels(m, kind)

    def _zero_lane_series(self, lane: str) -> None:
        key = (self.model, lane, DEFAULT_TENANT)
        for family in (*self.latency.values(), self.itl, self.prompt_tokens,
                       self.generation_tokens):
            family.labels(*key)
        for outcome, reasons in OUTCOME_REASONS.items():
            for reason in reasons:
                self.requests.labels(*key, outcome, reason)
        self.admissions.labels(*key, "admitted", "none")
        self.admissions.labels(*key, "rejected", OUTCOME_REASONS["rejected"][0])
        self._zeroed_lanes.add(lane)

    # ---- at scrape -------------------------------------------------------------------
    def _gauge_families(self) -> Iterator[GaugeMetricFamily]:
        g = self._gauges
        if g is None:
            return
        m, p = self.model, "batchpilot_"
        yield _by_label(p + "running_requests", "Requests running, by lane.", m, "lane",
                        g.running_by_lane)
        yield _by_label(p + "waiting_requests", "Requests queued, by lane.", m, "lane",
                        g.waiting_by_lane)
        reasons = dict.fromkeys(WAIT_REASONS, 0) | g.waiting_by_reason
        yield _by_label(p + "waiting_requests_by_reason", "Requests queued, by why the"
                        " scheduler started none (as of the last step).", m, "reason", reasons)
        live = g.live
        for name, doc, value in (
            ("kv_blocks_total", "KV cache blocks in the pool.", g.kv_blocks_total),
            ("kv_blocks_used", "KV blocks held by requests.", g.kv_blocks_used),
            ("kv_blocks_free", "KV blocks free (empty or cached).", g.kv_blocks_free),
            ("kv_blocks_cached", "Free KV blocks that hold a reusable prefix.",
             g.kv_blocks_cached),
            ("kv_usage_ratio", "KV blocks used / total.", g.kv_usage),
            # one series each, all lanes: what a gateway's endpoint picker reads (it takes
            # one series of a family, so a per-lane one would show it a single lane)
            ("num_requests_running", "Requests running, all lanes.",
             sum(g.running_by_lane.values())),
            ("num_requests_waiting", "Requests queued, all lanes.",
             sum(g.waiting_by_lane.values())),
            ("config_version", "Version of the live config in force.", live.version),
            ("config_max_num_seqs", "Live budget: running sequences.", live.max_num_seqs),
            ("config_max_num_batched_tokens", "Live budget: tokens per step.",
             live.max_num_batched_tokens),
            ("config_prefill_chunk_size", "Live budget: prompt tokens per request per step.",
             live.prefill_chunk_size),
            ("config_max_waiting_requests", "Live limit: queued requests.",
             live.max_waiting_requests),
            ("config_queue_timeout_seconds", "Live limit: time a request may queue.",
             live.queue_timeout_ms / 1000.0),
            ("config_kv_cache_high_watermark_ratio", "No new prefill starts above this.",
             live.kv_cache_high_watermark),
            ("config_kv_cache_reject_watermark_ratio", "New requests are rejected above this.",
             live.kv_cache_reject_watermark),
            ("config_chunked_prefill", "1 when prompts run in chunks.",
             float(live.chunked_prefill)),
        ):
            fam = GaugeMetricFamily(p + name, doc, labels=["model"])
            fam.add_metric([m], float(value))
            yield fam
        yield _by_label(p + "lane_weight", "Live lane share of the token budget.", m, "lane",
                        {lane.name: lane.weight for lane in live.lanes})
        if g.step_cost is not None:
            yield from step_cost_families(g.step_cost, m)


def _by_label(name: str, doc: str, model: str, label: str,
              values: dict[str, float]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=["model", label])
    for key, value in values.items():
        fam.add_metric([model, key], float(value))
    return fam


def counter_family(name: str, doc: str, labels: list[str],
                   values: dict[tuple[str, ...], float]) -> CounterMetricFamily:
    fam = CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
    for key, value in values.items():
        fam.add_metric(list(key), value)
    return fam
