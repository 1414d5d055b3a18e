"""`make mutants` bugs in the fleet, the trace's fleet merge, the edge, `batchpilot ctl`
and the dashboard's data (hand-planted 2026-12-07, second pass): each one passed every
test then, and the test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

FLEET_MUTANTS: list[Mutant] = [
    # ---- fleet, trace, edge, ctl and dashboard (hand-planted 2026-12; survivors then) ----
    Mutant("retiring-idle-ignores-queue", "control/fleet/scaling.py",
           'not p.get("running") and not p.get("waiting")', 'not p.get("running")',
           (CTL + "fleet/test_fleet_scaling_local.py::test_a_retiring_replica_with_any_work"
            "_left_is_still_called",),
           "a retiring replica with requests queued is sent to 0 under them"),
    Mutant("kv-index-reads-swapped", "control/fleet/metrics_merge.py",
           'reads.add_metric([rid, "snapshot"], row["snapshots"])',
           'reads.add_metric([rid, "snapshot"], row["batches"])',
           (CTL + "fleet/test_fleet_forward.py::test_kv_index_metrics_count_snapshots_and"
            "_batches_apart",), "/metrics shows a KV reader falling behind when it is not"),
    Mutant("gpu-placement-forgets-ingress", "control/fleet/placement.py",
           "needed = n * 1.0 + ingress", "needed = n * 1.0",
           (CTL + "fleet/test_fleet_placement.py::test_a_gpu_fleet_counts_the_ingress_cpu_too",),
           "a GPU fleet with no CPU left for its ingress deploys and Ray waits forever"),
    Mutant("canary-window-ignores-deadline", "control/fleet/replica_window.py",
           'good = rec.outcome == "finished" and (rec.deadline is None or end <= rec.deadline)',
           'good = rec.outcome == "finished"',
           (CTL + "fleet/test_replica_window_slo.py::test_a_request_that_finished_past_its"
            "_deadline_is_not_good",), "a canary that misses deadlines still counts as good"),
    Mutant("bound-token-named-replica-unscoped", "control/fleet/trace_fanout.py",
           "        if who.bound:  # never",
           "        if who.bound and request.headers.get(REPLICA_HEADER) is None:  # never",
           (SEC + "test_tenant_tokens.py::test_a_bound_token_naming_one_replica_still_sees_its"
            "_tenant_only",),
           "a tenant-bound token reads every tenant's rows by naming one replica"),
    Mutant("fleet-stream-not-cancelled", "control/fleet/forward.py",
           "        if not ended:  # the client left (cancelled): the replica aborts the request\n"
           "            gen.cancel()\n", "",
           (CTL + "fleet/test_fleet_forward.py::test_a_client_that_leaves_mid_stream_cancels"
            "_the_replica_call",),
           "a client that leaves keeps its request running (and its KV held) on the replica"),
    Mutant("down-replica-converged", "control/fleet/versioning.py",
           'r["fleet_version"] == r["target_version"] and r["healthy"]',
           'r["fleet_version"] == r["target_version"]',
           (CTL + "fleet/test_fleet_control_plane.py::test_a_replica_that_is_down_is_not"
            "_converged_whatever_it_last_reported",),
           "a fleet with a dead replica reads converged"),
    Mutant("fleet-history-drops-version-0", "control/fleet/versioning.py",
           "del self.history[1:-HISTORY_LIMIT]", "del self.history[:-HISTORY_LIMIT]",
           (CTL + "fleet/test_fleet_control_plane.py::test_the_history_keeps_version_0_past"
            "_its_limit",), "after 1000 changes the YAML baseline cannot be rolled back to"),
    Mutant("fleet-request-earliest", "control/trace/fleet_merge.py",
           "return max(found, key=", "return min(found, key=",
           (CTL + "fleet/test_fleet_trace_merge.py::test_a_request_id_on_two_replicas_is_the"
            "_one_that_finished_last",), "a reused request id shows its oldest run"),
    Mutant("fleet-steps-around-drops-the-moment", "control/trace/fleet_merge.py",
           'earlier = [r for r in rows if r["start_time"] <= at]',
           'earlier = [r for r in rows if r["start_time"] < at]',
           (CTL + "fleet/test_fleet_trace_merge.py::test_steps_around_count_a_step_at_the"
            "_moment_as_before_it",), "the step at the moment asked about is missing"),
    Mutant("fleet-loadtest-runs-oldest-first", "control/trace/fleet_merge.py",
           'rows.sort(key=lambda r: r.get("started") or 0.0, reverse=True)',
           'rows.sort(key=lambda r: r.get("started") or 0.0)',
           (CTL + "fleet/test_fleet_trace_merge.py::test_load_test_runs_are_newest_first_and"
            "_the_limit_keeps_the_newest",), "the fleet's latest load-test runs are cut off"),
    Mutant("fleet-union-by-position", "control/trace/fleet_db.py",
           '" UNION ALL BY NAME "', '" UNION ALL "',
           (CTL + "trace/test_trace_fleet.py::test_replicas_whose_columns_are_in_another_order"
            "_union_by_name",), "an older replica's values land under the wrong columns"),
    Mutant("edge-passes-client-elapsed", "control/edge/forward.py",
           '\n                   and k.decode("latin-1").lower() != EDGE_ELAPSED_HEADER]', "]",
           (SEC + "test_edge_process.py::test_the_edge_forwards_the_query_and_only_its_own"
            "_elapsed_header",), "a client moves its own arrival back (TTFT, queue delay)"),
    Mutant("edge-drops-query", "control/edge/forward.py",
           '        if request.url.query:\n            target += "?" + request.url.query\n', "",
           (SEC + "test_edge_process.py::test_the_edge_forwards_the_query_and_only_its_own"
            "_elapsed_header",), "behind the edge every ?param is ignored (dry_run applies)"),
    Mutant("converge-seconds-as-ms", "control/cli/ctl_format.py",
           "{data['converge_s'] * 1000:.0f} ms", "{data['converge_s']:.0f} ms",
           (CTL + "cli/test_ctl_cli.py::test_set_on_a_fleet_says_how_long_its_replicas_took",),
           "ctl set says every replica took a change in 0 ms"),
    Mutant("chart-times-as-ms", "dashboard/charts.py",
           'unit="s", utc=True', 'unit="ms", utc=True',
           ("tests/dashboard/test_dashboard.py::test_chart_times_are_read_as_epoch_seconds",),
           "every dashboard chart is dated January 1970"),
    Mutant("whatif-change-rules-drawn", "dashboard/charts.py",
           '        changes = changes[changes["source"] != "whatif"]\n', "        pass\n",
           ("tests/dashboard/test_dashboard.py::test_a_whatif_prediction_draws_no_change_rule",),
           "a what-if prediction draws as a config change on every chart"),
    Mutant("capacity-at-least-wrong-end", "dashboard/capacity_panel.py",
           "if cap == rates[-1] else", "if cap == rates[0] else",
           ("tests/dashboard/test_dashboard_whatif.py::test_capacity_in_words_says_at_least"
            "_only_at_the_highest_rate_swept",), "a config's capacity ceiling reads as a floor"),
    Mutant("dashboard-label-without-replica", "dashboard/context.py",
           'f"server {url}{one}"', 'f"server {url}"',
           ("tests/dashboard/test_dashboard_fleet_pages.py::test_one_replicas_answers_are_not_served_for"
            "_the_whole_fleet",), "one replica's cached answers are shown for the whole fleet"),
    Mutant("dashboard-readyz-503-no-replicas", "dashboard/context.py",
           "ready = exc.body if exc.status == 503 else {}", "ready = {}",
           ("tests/dashboard/test_dashboard_fleet_pages.py::test_the_replica_picker_lists_a_fleet_with_no"
            "_replica_ready",), "in an outage the dashboard cannot pick one replica's trace"),
    Mutant("latency-series-counts-rejected", "control/trace/series.py",
           "FROM requests WHERE {where} AND outcome <> 'rejected'\n        GROUP BY ALL",
           "FROM requests WHERE {where}\n        GROUP BY ALL",
           (CTL + "trace/test_trace_series.py::test_the_latency_series_counts_no_rejected"
            "_request",), "the latency chart counts rejections as served requests"),
    Mutant("kv-series-max-is-mean", "control/trace/series.py",
           "max(kv_usage) AS kv_usage_max", "avg(kv_usage) AS kv_usage_max",
           (CTL + "trace/test_trace_series.py::test_the_kv_series_max_is_each_buckets_peak",),
           "the KV chart hides the peaks that cross a watermark"),
    Mutant("local-fleet-fits-after-ray-only", "control/fleet/app.py",
           "            if not cuda:\n                fit_to_cluster(",
           "            if False:\n                fit_to_cluster(",
           (CTL + "fleet/test_fleet_placement.py::test_a_local_fleet_that_cannot_fit_fails"
            "_before_ray_starts",),
           "a fleet that cannot fit starts Ray (seconds, a dozen processes) to find out"),
]
