"""The trace's CLI tables, a request's timeline, the postmortem report's rules, checklist
facts and the what-if's bounds (pass of 2026-12-07); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

TRACE_VIEWS_MUTANTS: list[Mutant] = [
    Mutant("trace-steps-sizes-of-reasons", "control/trace/format.py",
           "{reasons[reason]}/{sum(reasons.values())}", "{reasons[reason]}/{len(reasons)}",
           (CTL + "trace/test_trace_format.py::test_steps_until_first_token_says_the_commonest"
            "_reason_out_of_all_steps",),
           "slow's 'steps until 1st token' says 18/2 (reasons) instead of 18/30 (steps)"),
    Mutant("trace-steps-at-line-above-its-step", "control/trace/format.py",
           "if not marked and r[\"start_time\"] > at:",
           "if not marked and r[\"start_time\"] >= at:",
           (CTL + "trace/test_trace_format.py::test_steps_at_a_moment_draws_the_line_after_the"
            "_step_that_started_then",),
           "steps --at T draws the moment above the step that started at T, as if after it"),
    Mutant("trace-summary-asked-needs-both", "control/trace/format.py",
           "if data[\"since\"] is not None or data[\"until\"] is not None:",
           "if data[\"since\"] is not None and data[\"until\"] is not None:",
           (CTL + "trace/test_trace_format.py::test_summary_says_the_window_asked_for_when_only"
            "_since_is_given",),
           "summary --since -1h shows the data's window but not the one the operator asked"),
    Mutant("trace-steps-batch-no-preempted", "control/trace/format.py",
           "    if r[\"preempted\"]:\n        lines.append(\"      preempted \"",
           "    if False:\n        lines.append(\"      preempted \"",
           (CTL + "trace/test_trace_format.py::test_steps_with_batch_name_the_requests"
            "_preempted_in_each_step",),
           "steps --batch never names the requests a step preempted"),
    Mutant("trace-slow-outcome-hides-reason", "control/trace/format.py",
           "return row[\"outcome\"] if reason in (\"\", row[\"outcome\"]) else",
           "return row[\"outcome\"] if True else",
           (CTL + "trace/test_trace_format.py::test_slow_shows_a_finish_reason_that_differs"
            "_from_the_outcome",),
           "slow shows 'finished' for a request cut at max tokens (finished/length)"),
    Mutant("trace-request-trace-lists-itself", "control/trace/format_request.py",
           "others = [r for r in tl.get(\"trace_requests\") or () if r != rec[\"request_id\"]]",
           "others = [r for r in tl.get(\"trace_requests\") or ()]",
           (CTL + "trace/test_trace_format.py::test_a_request_of_a_distributed_trace_names_the"
            "_others_not_itself",),
           "trace request ID lists the request itself among the other requests of its trace"),
    Mutant("trace-request-zero-blocks-unsaid", "control/trace/format_request.py",
           "held = \"\" if blocks is None else (", "held = \"\" if not blocks else (",
           (CTL + "trace/test_trace_format.py::test_a_precise_route_says_how_many_leading_blocks"
            "_the_replica_held_zero_too",),
           "a precise route that found none of the prompt cached says nothing of it"),
    Mutant("trace-request-rejection-message-lost", "control/trace/format_request.py",
           "        elif wait and wait[\"message\"]:", "        elif False:",
           (CTL + "trace/test_trace_format.py::test_a_rejection_event_carries_the_admission"
            "_message",),
           "trace request ID of a rejected request hides the message its client was sent"),
    Mutant("report-judge-crosses-previous-change", "control/trace/report.py",
           "                         changes[i - 1][\"time\"] if i else None) if x is not None)",
           "                         None) if x is not None)",
           (CTL + "trace/test_trace_report_rules.py::test_a_change_is_judged_by_requests_after"
            "_the_previous_change_only",),
           "a change is blamed for the previous change's regression (its window crosses it)"),
    Mutant("report-too-few-one-side", "control/trace/report.py",
           "if min(_served(before), _served(after)) < MIN_REQUESTS:",
           "if max(_served(before), _served(after)) < MIN_REQUESTS:",
           (CTL + "trace/test_trace_report_rules.py::test_too_few_requests_on_either_side_is_no"
            "_verdict",),
           "a change judged on 2 requests after it is named the cause of a regression"),
    Mutant("report-noise-floor-dropped", "control/trace/report.py",
           "return after >= before * WORSE_RATIO and after - before >= WORSE_ABS_S",
           "return after >= before * WORSE_RATIO",
           (CTL + "trace/test_trace_report_rules.py::test_a_p99_that_grew_by_less_than_20_ms_is"
            "_noise_however_large_the_ratio",),
           "a p99 going from 2 ms to 5 ms makes a change the suspected cause"),
    Mutant("report-burst-at-threshold-missed", "control/trace/report.py",
           "        if n < floor:", "        if n <= floor:",
           (CTL + "trace/test_trace_report_rules.py::test_a_bucket_with_exactly_the_threshold_is"
            "_a_burst_and_adjacent_ones_merge",),
           "a bucket with exactly the threshold's rejections is not reported as a burst"),
    Mutant("report-bursts-not-merged", "control/trace/report.py",
           "if bursts and abs(bursts[-1][\"end\"] - t) < 1e-6:", "if False:",
           (CTL + "trace/test_trace_report_rules.py::test_a_bucket_with_exactly_the_threshold_is"
            "_a_burst_and_adjacent_ones_merge",),
           "one rejection burst is reported as many, one per bucket"),
    Mutant("report-slowest-keeps-rejected", "control/trace/report.py",
           "by=\"e2e_s\") if r[\"outcome\"] != \"rejected\"]", "by=\"e2e_s\")]",
           (CTL + "trace/test_trace_report_rules.py::test_the_slowest_requests_leave_out_the"
            "_rejected",),
           "the postmortem's slowest requests include rejected ones, which never ran"),
    Mutant("report-instant-window-refused", "control/trace/report.py",
           "if since is not None and until is not None and since > until:",
           "if since is not None and until is not None and since >= until:",
           (CTL + "trace/test_trace_report_rules.py::test_a_window_of_one_instant_is_a_report"
            "_not_a_usage_error",),
           "report --since T --until T exits 2 saying --since is after --until"),
    Mutant("report-pipe-not-escaped", "control/trace/report_format.py",
           "return str(value).replace(\"|\", \"\\\\|\").replace(\"\\n\", \" \")",
           "return str(value).replace(\"\\n\", \" \")",
           (CTL + "trace/test_trace_report_rules.py::test_a_pipe_in_a_reason_does_not_split_the"
            "_timelines_table",),
           "a change reason with a '|' breaks the postmortem's Markdown table"),
    Mutant("report-startup-counts-as-change", "control/trace/report_format.py",
           "real = [c for c in r[\"changes\"] if c[\"source\"] != \"startup\"]",
           "real = list(r[\"changes\"])",
           (CTL + "trace/test_trace_report_rules.py::test_only_a_startup_row_is_no_config"
            "_change",),
           "a window with only the startup config says '1 change(s)' none of which explains it"),
    Mutant("report-ratio-inverted", "control/trace/report_format.py",
           "ratio = f\" (x{after / before:.1f})\" if after >= before else",
           "ratio = f\" (x{before / after:.1f})\" if after >= before else",
           (CTL + "trace/test_trace_report_rules.py::test_a_p99_change_shows_after_over_before",),
           "a p99 that went 20 ms -> 200 ms is shown as x0.1"),
    Mutant("waits-tokenize-over-gap", "control/trace/waits.py",
           "tokenize_s = min(max(0.0, tokenize_s), gap_s)", "tokenize_s = max(0.0, tokenize_s)",
           (CTL + "trace/test_trace_writer.py::test_tokenizing_longer_than_the_gap_is_all_of_it"
            "_and_no_more",),
           "a request's wait reasons add up to more than its queue delay"),
    Mutant("waits-preempted-last-only", "control/trace/waits.py",
           "self.preempted_s[rid] = self.preempted_s.get(rid, 0.0) + row.wait_s",
           "self.preempted_s[rid] = row.wait_s",
           (CTL + "trace/test_trace_writer.py::test_a_request_preempted_twice_counts_both_requeue"
            "_waits",),
           "a request preempted twice shows only its last re-queue in preempted_s"),
    Mutant("whatif-proposals-at-limit-refused", "control/whatif/bounds.py",
           "if len(props) > limits.max_whatif_proposals:",
           "if len(props) >= limits.max_whatif_proposals:",
           (SEC + "test_whatif_limits.py::test_exactly_the_limits_proposals_and_window_are"
            "_taken",),
           "a what-if with exactly max_whatif_proposals proposals is a 400"),
    Mutant("whatif-open-end-span-from-first", "control/whatif/bounds.py",
           "span = (last if until is None else until) - (first if since is None else since)",
           "span = (last if until is None else until) - first",
           (SEC + "test_whatif_limits.py::test_a_given_since_before_the_first_request_counts"
            "_from_since",),
           "since=-30d with until open passes a 7-day limit: a month-long replay is taken"),
    Mutant("trace-step-spans-never-merge", "control/trace/format.py",
           "if out and i == out[-1][1] + 1:", "if out and i == out[-1][1]:",
           (CTL + "trace/test_trace_format.py::test_step_ids_print_as_ranges_of_consecutive"
            "_steps",),
           "trace request ID lists every step it ran in, cut at 8: '3, 4, 5, ... 40 more'"),
    Mutant("trace-wait-row-at-its-start", "control/trace/rows.py",
           "        run_id, w.end, w.request_id, w.lane",
           "        run_id, w.start, w.request_id, w.lane",
           (CTL + "trace/test_trace_writer.py::test_a_wait_row_is_written_at_the_time_the_wait"
            "_ended",),
           "'queue wait ended' shows at the request's arrival; time windows miss late waits"),
    Mutant("trace-steps-at-with-since-taken", "control/trace/cli.py",
           "        if args.since is not None or args.until is not None:\n"
           "            raise TraceError(\"give --at T",
           "        if args.since is not None and args.until is not None:\n"
           "            raise TraceError(\"give --at T",
           (CTL + "trace/test_trace_cli.py::test_steps_at_a_moment_with_either_end_of_a_window"
            "_is_a_usage_error",),
           "steps --at T --since S silently ignores --since"),
    Mutant("trace-not-a-trace-opened", "control/trace/store.py",
           "    if missing:\n        con.close()", "    if False:\n        con.close()",
           (CTL + "trace/test_trace_cli.py::test_a_duckdb_file_that_is_not_a_trace_is_a_usage"
            "_error_naming_its_tables",),
           "--db on another DuckDB file is a traceback instead of 'not a batchpilot trace'"),
    Mutant("trace-facts-first-run", "control/trace/facts.py",
           "\" ORDER BY started DESC LIMIT 1\", [])", "\" ORDER BY started LIMIT 1\", [])",
           (CTL + "trace/test_trace_facts.py::test_the_facts_are_of_the_run_that_started_last",),
           "the go-live checklist judges a restarted server by its first run's settings"),
    Mutant("trace-facts-long-prompt-strict", "control/trace/facts.py",
           "count(*) FILTER (WHERE prompt_tokens >= ?) AS long_prompts",
           "count(*) FILTER (WHERE prompt_tokens > ?) AS long_prompts",
           (CTL + "trace/test_trace_facts.py::test_a_prompt_of_exactly_the_long_length_counts_as"
            "_long",),
           "a load test of 512-token prompts shows no long prompts to the checklist"),
    Mutant("trace-resume-is-a-version", "control/trace/audit_sources.py",
           "NOT_VERSIONS = (\"drain\", \"resume\", \"whatif\", LAW_REFIT_SOURCE, THREADS_SOURCE)",
           "NOT_VERSIONS = (\"drain\", \"whatif\", LAW_REFIT_SOURCE, THREADS_SOURCE)",
           (CTL + "trace/test_trace_report_rules.py::test_a_drain_or_resume_row_is_listed_but"
            "_never_judged",),
           "a resume of admission is judged (and can be blamed) as a config change"),
    Mutant("whatif-parallel-on-one-replica", "control/whatif/replay_many.py",
           "jobs = {name: pool.submit(run, window", "jobs = {name: pool.submit(replay, window",
           (CTL + "whatif/test_whatif_speed.py::test_parallel_replays_on_a_fleet_replay_on_the"
            "_fleet",),
           "whatif --workers 2 --replicas 4 predicts one replica taking the whole load"),
    Mutant("report-too-few-sides-swapped", "control/trace/report_format.py",
           "({c['before']['ttft_s_n']} before,\"\n"
           "                f\" {c['after']['ttft_s_n']} after)",
           "({c['after']['ttft_s_n']} before,\"\n"
           "                f\" {c['before']['ttft_s_n']} after)",
           (CTL + "trace/test_trace_report_rules.py::test_too_few_requests_says_how_many_arrived"
            "_on_each_side",),
           "the timeline says 40 requests before a change and 3 after when it was 3 and 40"),
    Mutant("trace-dur-us-in-ms", "control/trace/format.py",
           "return f\"{seconds * 1e6:.0f} us\"", "return f\"{seconds * 1e3:.0f} us\"",
           (CTL + "trace/test_trace_format.py::test_durations_print_in_us_ms_or_s_by_size",),
           "a 500 us step prints as '0 us': sub-millisecond times read a thousand times low"),
]
