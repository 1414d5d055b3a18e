"""`make mutants` bugs in the OpenTelemetry spans and trace links, the metrics, the control
API's versions and file reloads, and the lane SLOs (hand-planted 2026-12-07, third pass):
each one passed every test then, and the test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

OBSERVABILITY_MUTANTS: list[Mutant] = [
    # ---- control/otel: the ingress hop, traceparent, phases and spans (hand pass 2026-12) --
    Mutant("ingress-500-not-exported", "control/otel/door.py",
           "if self.sampled or status >= 500:", "if self.sampled or status > 500:",
           (CTL + "otel/test_fleet_traces.py::test_an_ingress_500_is_exported_as_an_error"
            "_even_when_not_sampled",),
           "a plain 500 at the ingress of an unsampled request leaves no trace at all"),
    Mutant("ingress-500-not-error", "control/otel/spans.py",
           "    error = status >= 500\n", "    error = status > 500\n",
           (CTL + "otel/test_fleet_traces.py::test_an_ingress_500_is_exported_as_an_error"
            "_even_when_not_sampled",),
           "an ingress routing span that answered 500 shows as a success in the trace backend"),
    Mutant("ingress-forwards-callers-flag", "control/otel/door.py",
           "value = traceparent(self.link, self.sampled).encode()",
           "value = traceparent(self.link).encode()",
           (CTL + "otel/test_fleet_traces.py::test_the_replica_is_told_the_ingress_sampling"
            "_decision_not_the_callers",),
           "a trace the ingress sampled by ratio has its routing span but no replica spans"),
    Mutant("traceparent-any-flag-sampled", "control/otel/context.py",
           "bool(int(flags, 16) & 1)", "bool(int(flags, 16))",
           (CTL + "otel/test_traceparent.py::test_only_the_sampled_bit_of_the_flags_means"
            "_sampled",),
           "a caller's unsampled level-2 traceparent (flags 02) is exported as sampled"),
    Mutant("sibling-choices-share-span", "control/otel/context.py",
           "return dataclasses.replace(link, span_id=new_span_id())",
           "return dataclasses.replace(link)",
           (CTL + "otel/test_traceparent.py::test_each_later_choice_is_a_span_of_its_own_under"
            "_the_same_parent",),
           "an n > 1 request's choices export spans with one span id: a broken trace tree"),
    Mutant("preempted-run-ends-late", "control/otel/phases.py",
           "run.end, run.preempted_at_step = record.start_time, record.step_id",
           "run.end, run.preempted_at_step = record.end_time, record.step_id",
           (CTL + "otel/test_span_phases.py::test_a_preempted_run_ends_where_the_preempting"
            "_step_starts",),
           "a preempted request's decode span overlaps its requeued wait; phases exceed E2E"),
    Mutant("phase-purge-forgets-live", "control/otel/phases.py",
           "if now - p.seen_at > STALE_AFTER_S]", "if now - p.seen_at < STALE_AFTER_S]",
           (CTL + "otel/test_span_phases.py::test_only_requests_admitted_longer_ago_than_the"
            "_stale_limit_are_forgotten",),
           "every minute the span thread forgets the running requests: their spans lose phases"),
    Mutant("recompute-not-marked", "control/otel/spans.py",
           "run, i > 0, end)", "run, i > 1, end)",
           (CTL + "otel/test_span_phases.py::test_the_phase_spans_of_a_preempted_request_tile"
            "_it_and_mark_the_recompute",),
           "the prefill that recomputes a preempted request is shown as its first prefill"),
    Mutant("telemetry-list-accepted", "control/otel/cli_args.py",
           "    if not isinstance(block, dict):\n        raise",
           "    if not isinstance(block, (dict, list)):\n        raise",
           (CTL + "otel/test_otlp_export.py::test_a_telemetry_block_that_is_not_a_mapping_is"
            "_refused_naming_its_keys",),
           "telemetry: [] is silently no export; a list of keys fails without naming them"),
    # ---- control/metrics -----------------------------------------------------------------
    Mutant("queue-timeout-gauge-in-ms", "control/metrics/registry.py",
           "live.queue_timeout_ms / 1000.0", "live.queue_timeout_ms",
           (CTL + "metrics/test_metrics_labels.py::test_the_live_queue_timeout_is_a_gauge_in"
            "_seconds",),
           "batchpilot_config_queue_timeout_seconds says 30000 for a 30 s timeout"),
    Mutant("config-changes-undercounted", "control/metrics/registry.py",
           "self.config_changes.labels(self.model).inc(version - self._config_version)",
           "self.config_changes.labels(self.model).inc()",
           (CTL + "metrics/test_metrics_labels.py::test_config_changes_count_every_version"
            "_even_when_several_arrive_at_once",),
           "two config changes between gauge refreshes count as one"),
    Mutant("reason-label-whole-detail", "control/metrics/registry.py",
           'text.split(":", 1)[0].lower()', "text.lower()",
           (CTL + "metrics/test_metrics_labels.py::test_a_failed_step_is_counted_under_its"
            "_reason_not_its_message",),
           "failed steps and queue timeouts are counted under reason=\"other\""),
    Mutant("itl-sum-skips-first-gap", "control/metrics/core.py",
           "self.sum += times[-1] - times[0]", "self.sum += times[-1] - times[1]",
           (CTL + "metrics/test_histogram_buckets.py::test_the_inter_token_sum_is_the_first_to"
            "_last_token_time",),
           "the mean inter-token latency (_sum / _count) reads low"),
    Mutant("genai-error-type-lost", "control/metrics/genai.py",
           'error = rec.outcome if rec.outcome in ERROR_OUTCOMES else ""', 'error = ""',
           (CTL + "metrics/test_genai_metrics.py::test_failures_are_labelled_and_only"
            "_successes_time_their_tokens",),
           "a GenAI dashboard's error rate (error_type) is always 0"),
    Mutant("genai-ttft-of-failures", "control/metrics/genai.py",
           '        if rec.outcome == "finished":\n', '        if rec.outcome != "rejected":\n',
           (CTL + "metrics/test_genai_metrics.py::test_failures_are_labelled_and_only"
            "_successes_time_their_tokens",),
           "timed-out requests' TTFT lands in the successful responses' TTFT histogram"),
    Mutant("vllm-error-not-counted", "control/metrics/gateway.py",
           'OUTCOME_REASON = {"cancelled": "abort", "timeout": "abort", "error": "error"}',
           'OUTCOME_REASON = {"cancelled": "abort", "timeout": "abort"}',
           (CTL + "metrics/test_metrics_compat.py::test_failed_and_timed_out_requests_count_in"
            "_vllm_request_success",),
           "vllm:request_success{finished_reason=\"error\"} stays 0 while requests fail"),
    Mutant("idle-gauges-stale", "control/metrics/observer.py",
           "if now >= self._next_gauges or not engine.requests:",
           "if now >= self._next_gauges:",
           (CTL + "metrics/test_observer_feed.py::test_an_idle_engine_refreshes_the_gauges"
            "_whatever_the_interval",),
           "an idle server keeps showing a request running (a gateway routes around it)"),
    Mutant("kv-jump-no-snapshot", "control/metrics/observer.py",
           '                 (0, 2): "above_reject_watermark", (2, 0): "below_high_watermark"}',
           '                 (2, 0): "below_high_watermark"}',
           (CTL + "metrics/test_observer_feed.py::test_every_watermark_crossing_takes_a_kv"
            "_snapshot_even_a_jump_over_both",),
           "KV usage jumping past both watermarks in one step leaves no snapshot in the trace"),
    Mutant("gc-buckets-not-cumulative", "control/metrics/gc_pauses.py",
           "zip(BUCKETS, cumulative, strict=False)",
           "zip(BUCKETS, self._counts[generation], strict=False)",
           (CTL + "metrics/test_gc_pauses.py::test_the_pause_buckets_are_cumulative_and_the"
            "_slow_ones_reach_inf",),
           "histogram_quantile over GC pauses gives nonsense (buckets not cumulative)"),
    # ---- control/admin -------------------------------------------------------------------
    Mutant("admission-open-while-draining", "control/admin/routes.py",
           '"draining" if engine.admission_paused or engine.draining else "open"',
           '"draining" if engine.admission_paused else "open"',
           (CTL + "admin/test_control_versions.py::test_a_server_shutting_down_says_draining_and"
            "_cannot_be_resumed",),
           "ctl get says admission open on a server that refuses every request (shutting down)"),
    Mutant("resume-while-shutting-down", "control/admin/routes.py",
           "    if store.engine.draining:\n", "    if False:\n",
           (CTL + "admin/test_control_versions.py::test_a_server_shutting_down_says_draining_and"
            "_cannot_be_resumed",),
           "a resume on a shutting-down server answers open while requests stay refused"),
    Mutant("weak-etag-refused", "control/admin/routes.py",
           """header.strip().removeprefix("W/").strip('"')""", """header.strip().strip('"')""",
           (CTL + "admin/test_control_versions.py::test_a_weak_etag_is_a_version_and_an_unchanged"
            "_patch_makes_no_version",),
           "a client echoing a weak ETag (W/\"1\") gets a 400 on every change"),
    Mutant("noop-patch-new-version", "control/admin/config_store.py",
           "if dry_run or not changes:", "if dry_run:",
           (CTL + "admin/test_control_versions.py::test_a_weak_etag_is_a_version_and_an_unchanged"
            "_patch_makes_no_version",),
           "a patch that changes nothing bumps the version: other operators' If-Match go stale"),
    Mutant("rollback-ignores-if-match", "control/admin/config_store.py",
           "current = self._check_version(expected_version)\n            new = target",
           "current = self.current()\n            new = target",
           (CTL + "admin/test_control_versions.py::test_a_rollback_or_profile_with_a_stale_if_match"
            "_is_refused",),
           "a rollback made on an old read silently undoes a colleague's newer change"),
    Mutant("reload-keeps-removed-lane", "control/admin/config_watch.py",
           "{**{name: None for name in live.lane_names if name not in new},\n"
           "                              **{lane.name",
           "{**{lane.name",
           (CTL + "admin/test_control_versions.py::test_a_reloaded_file_removes_the_lanes_it"
            "_dropped_and_brings_new_profiles",),
           "a lane deleted from the YAML stays live after the reload"),
    Mutant("reload-profiles-only-ignored", "control/admin/config_watch.py",
           "        self.store.reloaded_profiles = profiles\n        self.last_error = None\n",
           "        self.last_error = None\n        if result.applied:\n"
           "            self.store.reloaded_profiles = profiles\n",
           (CTL + "admin/test_control_versions.py::test_a_reloaded_file_removes_the_lanes_it"
            "_dropped_and_brings_new_profiles",),
           "a YAML edit of the profiles alone is ignored: ctl profile applies the old one"),
    # ---- engine/config -------------------------------------------------------------------
    Mutant("slo-met-at-bound-fails", "engine/config/slo.py",
           "(ttft_s is None or ttft_s > self.ttft_s)", "(ttft_s is None or ttft_s >= self.ttft_s)",
           (ENG + "test_lane_slo.py::test_a_request_meets_its_slo_up_to_and_at_each_target",),
           "a request exactly at its TTFT target counts as an SLO miss (goodput, canary)"),
    Mutant("slo-one-token-misses", "engine/config/slo.py",
           "return self.tpot_s is None or tpot_s is None or tpot_s <= self.tpot_s",
           "return self.tpot_s is None or (tpot_s is not None and tpot_s <= self.tpot_s)",
           (ENG + "test_lane_slo.py::test_a_request_meets_its_slo_up_to_and_at_each_target",),
           "every one-token request misses a lane's TPOT target"),
    Mutant("slo-zero-target-accepted", "engine/config/slo.py",
           "not 0 < value <= MAX_SLO_S", "not 0 <= value <= MAX_SLO_S",
           (ENG + "test_lane_slo.py::test_a_target_outside_zero_to_an_hour_is_refused_naming_it",),
           "ttft_s: 0 is accepted: every request of the lane misses (and is shed as unreachable)"),
    Mutant("dtype-case-sensitive", "engine/config/dtype_option.py",
           "choice = str(value).lower()", "choice = str(value)",
           ("tests/control/serve/test_dtype_option.py::test_a_dtype_is_read_in_any_case_and_by"
            "_its_short_name",),
           "--dtype BF16 or FP32 is refused"),
]
