"""`make mutants` bugs in the trace's writer, retention, export window and tenant scope, the
what-if's routes, CLI and fleet replay, and the simulator's faults (hand-planted 2026-12-07,
fourth pass): each one passed every test then, and the test it names was written to catch
it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, SEC, Mutant

TRACE_MUTANTS: list[Mutant] = [
    Mutant("sim-fault-fires-once-more", "engine/sim/faults.py",
           "self.fired >= self.times", "self.fired > self.times",
           (ENG + "test_fault_rules.py::test_a_fault_with_times_fires_exactly_that_many_times",),
           "a fault meant to fail one call fails a retry too: a transient-fault test ends"
           " requests it should spare"),
    Mutant("sim-fault-prefill-only-inverted", "engine/sim/faults.py",
           "        if not self.prefill_only:", "        if self.prefill_only:",
           (ENG + "test_fault_rules.py::test_a_prefill_only_fault_spares_the_request_while_it"
            "_decodes",),
           "an OOM-on-prefill fault also fires while the request decodes"),
    Mutant("sim-corrupt-first-row", "engine/sim/faults.py",
           "sampled[:-1] + [CorruptToken()]", "[CorruptToken()] + sampled[1:]",
           (ENG + "test_fault_rules.py::test_a_corrupt_step_fault_spoils_only_the_last_sample"
            "_row",),
           "a corrupt step fault spoils the first row: update() fails before applying any"),
    Mutant("sim-prefill-cost-per-chunk", "engine/sim/executor.py",
           "self.prefill_token_cost_s * out.num_prefill_tokens",
           "self.prefill_token_cost_s * len(out.prefills)",
           (ENG + "test_sim_executor_cost.py::test_a_step_costs_its_fixed_cost_plus_each_prompt"
            "_and_decode_token",),
           "simulated prompts cost the same at 8 or 8000 tokens: every timing study is off"),
    Mutant("whatif-zero-slo-accepted", "control/whatif/routes.py",
           "isinstance(value, bool) or value <= 0", "isinstance(value, bool) or value < 0",
           (CTL + "whatif/test_whatif_api.py::test_bad_input_is_400_naming_the_field",),
           "an SLO of 0 s is taken: goodput 0 for every config instead of a 400"),
    Mutant("whatif-history-note-inverted", "control/whatif/routes.py",
           "    if current.version == version:  # no change since",
           "    if current.version != version:  # no change since",
           (CTL + "whatif/test_whatif_api.py::test_a_window_version_gone_from_the_history_is"
            "_said_in_the_notes",),
           "a what-if replayed under a config other than the window's says nothing"),
    Mutant("whatif-cli-exit-codes-swapped", "control/whatif/cli.py",
           "2 if 400 <= exc.status < 500 else 1", "1 if 400 <= exc.status < 500 else 2",
           (CTL + "whatif/test_whatif_cli.py::test_a_servers_refusal_is_exit_2_and_its_failure"
            "_exit_1",),
           "whatif --url: a bad setting exits 1 (retry) and a server failure 2 (usage)"),
    Mutant("whatif-cli-compare-name-twice", "control/whatif/cli.py",
           "            if name in out:", "            if False:",
           (CTL + "whatif/test_whatif_cli.py::test_bad_input_is_exit_2_with_what_to_fix",),
           "a --compare name given twice silently keeps only the last one"),
    Mutant("whatif-cli-url-drops-slo", "control/whatif/cli.py",
           "    if slo is not None:\n        body[\"slo\"]", "    if False:\n        body[\"slo\"]",
           (CTL + "whatif/test_whatif_cli.py::test_url_sends_the_slo_and_rates_and_leaves_the"
            "_defaults_to_the_server",),
           "whatif --url --slo-ttft 0.5 predicts without the SLO: no goodput"),
    Mutant("whatif-config-notes-dropped", "control/whatif/run.py",
           "list(notes or ()) + config_notes", "list(notes or ())",
           (CTL + "whatif/test_whatif_notes.py::test_the_result_carries_the_callers_and_the"
            "_reconstructed_configs_notes",),
           "a prediction hides which settings it guessed from the trace"),
    Mutant("fleet-replay-kv-peak-summed", "control/whatif/fleet_replay.py",
           "max(rep.kv_peak for rep in fleet), sum(rep.preempted",
           "sum(rep.kv_peak for rep in fleet), sum(rep.preempted",
           (CTL + "whatif/test_whatif_fleet_replay.py::test_the_fleet_kv_peak_is_the_busiest"
            "_replicas",),
           "a fleet what-if shows the replicas' KV peaks added up, of one replica's pool"),
    Mutant("fleet-replay-span-least-busy", "control/whatif/fleet_replay.py",
           "max(rep.clock.now for rep in fleet) - window.since",
           "min(rep.clock.now for rep in fleet) - window.since",
           (CTL + "whatif/test_whatif_fleet_replay.py::test_the_fleet_replay_spans_until_its"
            "_last_request_ends",),
           "a fleet what-if's span (and rates over it) ends with the least busy replica"),
    Mutant("fleet-replay-late-cancels-skipped", "control/whatif/fleet_replay.py",
           "    for when, j in sorted(cancels):  # cancels after the last arrival",
           "    for when, j in sorted(cancels)[:0]:  # cancels after the last arrival",
           (CTL + "whatif/test_whatif_fleet_replay.py::test_a_cancel_after_the_last_arrival"
            "_still_cancels_on_the_fleet",),
           "on a fleet what-if the last requests' cancels never happen: they run to the end"),
    Mutant("whatif-lean-context-short", "control/whatif/lean.py",
           "context = sum(map(_computed, decodes)) + len(decodes)",
           "context = sum(map(_computed, decodes))",
           (CTL + "whatif/test_whatif_lean_features.py::test_each_decode_attends_to_its_tokens"
            "_so_far_and_the_one_it_adds",),
           "the replay's decode steps cost less than the fit says: optimistic predictions"),
    Mutant("whatif-lean-prompt-step-always", "control/whatif/lean.py",
           "1.0 if prefill else 0.0)", "1.0)",
           (CTL + "whatif/test_whatif_lean_features.py::test_the_prompt_step_cost_applies_to"
            "_steps_with_a_prompt_chunk_only",),
           "every replayed decode step pays a prompt step's fixed cost: pessimistic TPOT"),
    Mutant("retention-trims-newest", "control/trace/retention.py",
           "lo + (hi - lo) * retention.trim_fraction",
           "hi - (hi - lo) * retention.trim_fraction",
           (CTL + "trace/test_trace_retention.py::test_over_the_size_limit_the_oldest_fifth_of"
            "_the_span_is_deleted",),
           "over the size limit, 80% of the trace goes, the newest kept least"),
    Mutant("retention-floor-1kib", "control/trace/retention.py",
           "self.max_bytes < 1 << 20", "self.max_bytes < 1 << 10",
           (CTL + "trace/test_trace_retention.py::test_a_size_limit_under_one_mib_is_refused",),
           "--trace-max-mb below 1 MiB is taken: the trace is trimmed every check"),
    Mutant("retention-ignores-wal", "control/trace/retention.py",
           "for p in (path, path + \".wal\")", "for p in (path,)",
           (CTL + "trace/test_trace_retention.py::test_the_wal_counts_towards_the_size",),
           "the trace's disk use passes its size limit by the WAL's size"),
    Mutant("retention-deletes-runs", "control/trace/retention.py",
           "        if table is RUNS:\n            continue\n", "",
           (CTL + "trace/test_trace_retention.py::test_retention_by_age_keeps_the_run_rows",),
           "after max age a long-running server's runs row (model, settings) is deleted"),
    Mutant("trace-writer-uncounted-admissions", "control/trace/writer.py",
           "        d[ADMISSIONS.name] += len(item.admissions)\n", "",
           (CTL + "trace/test_trace_writer_losses.py::test_a_full_queue_counts_each_dropped"
            "_admission",),
           "admission rows lost to a full queue are not counted in the dropped metric"),
    Mutant("trace-writer-failed-flush-counts-one", "control/trace/writer.py",
           "                self._dropped_failed[name] += len(table_rows)",
           "                self._dropped_failed[name] += 1",
           (CTL + "trace/test_trace_writer_losses.py::test_a_failed_flush_counts_every_row_it"
            "_lost",),
           "a failed flush of 500 rows shows as 1 dropped"),
    Mutant("trace-writer-loses-queued-wait", "control/trace/writer.py",
           "            if wait is not None:\n                b[ADMISSIONS.name].append(rows"
           ".wait_row(run, wait))\n        ", "        ",
           (CTL + "trace/test_trace_writer_losses.py::test_a_request_cancelled_in_the_queue"
            "_keeps_its_queue_wait",),
           "a request cancelled or timed out in the queue leaves no queue wait row"),
    Mutant("trace-scope-running-not-own", "control/trace/tenant_scope.py",
           "         \" UNION SELECT run_id, request_id FROM admissions\")", "         )",
           (SEC + "test_tenant_scope_rows.py::test_a_running_request_of_the_tenant_is_its_own"
            "_in_steps_and_request_ids",),
           "a bound reader's still-running requests show as NULL in its steps"),
    Mutant("trace-scope-runs-settings-shown", "control/trace/tenant_scope.py",
           "f\"SELECT * REPLACE (NULL::VARCHAR AS settings) FROM {src('runs')}\"",
           "f\"SELECT * FROM {src('runs')}\"",
           (SEC + "test_tenant_scope_rows.py::test_a_bound_reader_gets_no_server_settings_from"
            "_runs",),
           "a tenant-bound token exports the server's settings from runs"),
    Mutant("export-request-ids-flipped", "control/trace/export_route.py",
           "        clauses.append(\"time <= ?\")", "        clauses.append(\"time >= ?\")",
           (SEC + "test_tenant_scope_rows.py::test_the_export_window_keeps_rows_up_to_and_at"
            "_until",),
           "a fleet's merged steps lose the request numbers of the window's requests"),
    Mutant("export-arrival-strict", "control/trace/export_route.py",
           "            clauses.append(\"arrival_time <= ?\")",
           "            clauses.append(\"arrival_time < ?\")",
           (SEC + "test_tenant_scope_rows.py::test_the_export_window_keeps_rows_up_to_and_at"
            "_until",),
           "a fleet answer misses the request that arrived exactly at until"),
    Mutant("trace-series-by-unchecked", "control/trace/routes.py",
           "    if by is not None and kind != \"latency\":",
           "    if by is not None and kind == \"steps\":",
           (CTL + "trace/test_trace_series_route.py::test_by_on_another_series_is_a_400_naming"
            "_it",),
           "by= on the queues or outcomes series is a 500 instead of a 400 naming it"),
]
