"""`make mutants` bugs in the load tester's wire reading, transports, scenarios and CLI, and
the go-live checklist's report, CLI, spec and client (hand-planted 2026-12-07, fourth pass):
each one passed every test then, and the test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

LOADTEST_MUTANTS: list[Mutant] = [
    Mutant("loadtest-503-counted-as-error", "control/loadtest/wire.py",
           "REJECTED_STATUSES = (429, 503)", "REJECTED_STATUSES = (429,)",
           (CTL + "loadtest/test_loadtest_wire.py::test_a_503_is_a_rejection_like_a_429_and"
            "_a_500_an_error",),
           "a server shedding load with 503 is reported as erroring, not as rejecting"),
    Mutant("loadtest-ttft-of-last-chunk", "control/loadtest/wire.py",
           "            if result.ttft_s is None:\n                result.ttft_s = now",
           "            result.ttft_s = now",
           (CTL + "loadtest/test_loadtest_wire.py::test_ttft_is_the_first_chunk_with_text_not"
            "_the_last",),
           "a stream's TTFT is its last chunk's time: TTFT reads as long as E2E"),
    Mutant("loadtest-textless-resend-ttft-no-offset", "control/loadtest/wire.py",
           "result.last_send_s + result.server_ttft_s", "result.server_ttft_s",
           (CTL + "loadtest/test_loadtest_wire.py::test_a_resent_stream_without_text_counts"
            "_its_ttft_from_the_first_send",),
           "a resent request's TTFT leaves out the wait before its resend"),
    Mutant("loadtest-server-timeout-is-ok", "control/loadtest/wire.py",
           'result.outcome = "timeout" if reason == "timeout" else "ok"',
           'result.outcome = "ok"',
           (CTL + "loadtest/test_loadtest_wire.py::test_a_stream_the_server_ended_on_its"
            "_timeout_is_a_timeout_not_ok",),
           "requests the server timed out count as ok in the report and goodput"),
    Mutant("loadtest-local-first-send-is-resend", "control/loadtest/local_streams.py",
           "headers_for(p, result.sends - 1)", "headers_for(p, result.sends)",
           (CTL + "loadtest/test_sse_transport.py::test_a_first_send_says_it_is_no_resend",),
           "every local first send says X-Stainless-Retry-Count 1: the server counts it late"),
    Mutant("scenario-min-equal-max-refused", "control/loadtest/scenario_parse.py",
           "dist.min > dist.max", "dist.min >= dist.max",
           (CTL + "loadtest/test_scenario_parse.py::test_a_uniform_dist_with_min_equal_to_max"
            "_is_a_fixed_length",),
           "a uniform length with min == max is refused as min > max"),
    Mutant("scenario-true-as-count", "control/loadtest/scenario_parse.py",
           " or (kind is int and isinstance(value, bool))", "",
           (CTL + "loadtest/test_scenario_parse.py::test_true_is_not_a_count",),
           "requests: yes loads as one request instead of an error"),
    Mutant("scenario-all-zero-weights", "control/loadtest/scenario_parse.py",
           "    if block and not any(weight for _, weight in weights):\n"
           '        raise ValueError(f"{where}: at least one weight must be > 0")\n', "",
           (CTL + "loadtest/test_scenario_parse.py::test_weights_that_are_all_zero_are"
            "_refused",),
           "tenants or lanes weighted all 0 load, and plan no tenant to draw from"),
    Mutant("scenario-lognormal-mean-zero", "control/loadtest/scenario_parse.py",
           '    if kind == "lognormal" and not dist.mean:\n'
           '        raise ValueError(f"{where}.mean=0 must be > 0")\n', "",
           (CTL + "loadtest/test_scenario_parse.py::test_a_lognormal_of_mean_zero_is"
            "_refused",),
           "a lognormal of mean 0 loads instead of naming the field"),
    Mutant("loadtest-prompts-shared-by-configs", "control/loadtest/cli.py",
           'f"{scenario.seed}:{name}:{round_no}"', 'f"{scenario.seed}:{round_no}"',
           (CTL + "loadtest/test_loadtest_cli.py::test_each_compared_config_runs_on_its_own"
            "_prompt_texts",),
           "an A/B's later config is served from the prefix cache of the earlier one's prompts"),
    Mutant("loadtest-compare-same-name", "control/loadtest/cli.py",
           "    if len(set(names)) != len(names):\n"
           '        raise CtlError("--compare names must differ", 2)\n', "",
           (CTL + "loadtest/test_loadtest_cli.py::test_two_configs_under_one_name_are"
            "_refused",),
           "two configs under one --compare name are pooled into one row"),
    Mutant("loadtest-zero-rounds", "control/loadtest/cli.py",
           "    if args.rounds < 1:\n"
           '        raise CtlError("--rounds must be >= 1", 2)\n', "",
           (CTL + "loadtest/test_loadtest_cli.py::test_zero_rounds_is_a_usage_error",),
           "--rounds 0 crashes after contacting the server instead of a usage error"),
    Mutant("loadtest-rounds-longest-time", "control/loadtest/cli.py",
           "duration = sum(d for _, d, _ in runs[name])",
           "duration = max(d for _, d, _ in runs[name])",
           (CTL + "loadtest/test_loadtest_cli.py::test_rounds_of_a_config_pool_their_requests"
            "_over_their_summed_time",),
           "with --rounds 2 every throughput and goodput is reported doubled"),
    Mutant("prompts-resize-wrong-way", "control/loadtest/prompts.py",
           "length = max(1, length + num_tokens - n)", "length = max(1, length + n - num_tokens)",
           (CTL + "loadtest/test_loadtest_prompts.py::test_a_window_that_re_encodes_longer_is"
            "_shrunk_to_the_asked_length",),
           "prompts that re-encode longer are sent at the wrong length"),
    Mutant("checklist-ready-with-needs", "control/checklist/report.py",
           "ready = counts[FAIL] == 0 and counts[NEEDS] == 0", "ready = counts[FAIL] == 0",
           (CTL + "checklist/test_checklist_report.py::test_evidence_missing_is_not_ready_and"
            "_says_so",),
           "an undecided checklist says ready to go live (JSON ready: true)"),
    Mutant("checklist-needs-said-fail", "control/checklist/report.py",
           '"NOT ready: items fail" if s[FAIL] else "not decided: evidence missing"',
           '"NOT ready: items fail"',
           (CTL + "checklist/test_checklist_report.py::test_evidence_missing_is_not_ready_and"
            "_says_so",),
           "missing evidence is summed up as items failing"),
    Mutant("checklist-md-pipe", "control/checklist/report.py",
           'return text.replace("|", "\\\\|").replace("\\n", "<br>")',
           'return text.replace("\\n", "<br>")',
           (CTL + "checklist/test_checklist_report.py::test_a_pipe_in_the_evidence_stays_in"
            "_its_markdown_cell",),
           "evidence with a | breaks the go-live Markdown table"),
    Mutant("checklist-strict-off", "control/checklist/cli.py",
           "return exit_code(results, args.strict)", "return exit_code(results, False)",
           (CTL + "checklist/test_checklist_cli.py::test_strict_fails_a_checklist_that_needs"
            "_evidence",),
           "--strict lets an undecided checklist pass a deployment gate"),
    Mutant("checklist-cli-replica-dropped", "control/checklist/cli.py",
           "control = ControlClient(url, args.token_env, replica=args.replica)",
           "control = ControlClient(url, args.token_env)",
           (CTL + "checklist/test_checklist_cli.py::test_checklist_replica_reaches_the_control"
            "_client",),
           "--replica judges the ingress's config and every replica's metrics"),
    Mutant("checklist-503-fatal", "control/checklist/client.py",
           "if status in (404, 503):", "if status == 404:",
           (CTL + "checklist/test_checklist_client.py::test_a_loading_server_is_unavailable"
            "_evidence_and_a_500_an_error",),
           "a server still loading ends the checklist with exit 2"),
    Mutant("checklist-replica-metrics-all", "control/checklist/client.py",
           "line.startswith(\"#\") or f'replica=\"{replica}\"' in line]",
           "line.startswith(\"#\") or 'replica=\"' in line]",
           (CTL + "checklist/test_checklist_client.py::test_one_replicas_metrics_keep_its"
            "_samples_and_the_comments",),
           "one replica's checklist reads every replica's metrics"),
    Mutant("checklist-replica-header-lost", "control/checklist/client.py",
           "        if self.replica is not None:\n"
           "            headers[REPLICA_HEADER] = self.replica\n", "",
           (CTL + "checklist/test_checklist_client.py::test_a_checklist_of_one_replica_names"
            "_it_in_each_request",),
           "--replica's config and history come from whichever replica answers"),
    Mutant("checklist-trace-lane-removal-kept", "control/checklist/trace_config.py",
           '    if value is None and len(keys) == 2 and keys[0] in ("lanes", "tenant_lanes"):\n'
           "        node.pop(keys[-1], None)\n    else:\n        node[keys[-1]] = value",
           "    node[keys[-1]] = value",
           (CTL + "checklist/test_checklist_trace_config.py::test_a_lane_removed_by_a_replayed"
            "_change_is_gone_from_the_config",),
           "a lane removed during the run still counts in the trace's config"),
    Mutant("checklist-param-last-item", "control/checklist/spec.py",
           "                if item.check == check:\n"
           "                    return item.params.get(key, default)",
           "                if item.check == check and item.params.get(key) is not None:\n"
           "                    default = item.params[key]",
           (CTL + "checklist/test_checklist_spec.py::test_a_checks_parameter_is_read_from_the"
            "_first_item_using_it",),
           "the evidence gathers by the last item's parameter, not the first's"),
]
