"""The command lines, the dashboard's pages, OpenTelemetry's sampling counter and the
checklist's ops items (pass of 2026-12-07); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

CLI_MUTANTS: list[Mutant] = [
    Mutant("ctl-rollback-previous-needs-three", "control/cli/ctl.py",
           "if len(versions) < 2:", "if len(versions) <= 2:",
           (CTL + "cli/test_ctl_cli.py::test_rollback_previous_undoes_the_only_change",),
           "`ctl rollback previous` refuses to undo the only change since start-up"),
    Mutant("ctl-canary-exit-code-lost", "control/cli/ctl.py",
           "return code[0] if code else 0", "return 0",
           (CTL + "cli/test_ctl_canary.py::test_following_a_canary_that_rolled_back_exits_4",),
           "a canary that rolled the change back exits 0: a pipeline takes it as a success"),
    Mutant("ctl-canary-oldest-polls", "control/cli/ctl_canary.py",
           'poll_line(r, p) for p in r["polls"][-5:])',
           'poll_line(r, p) for p in r["polls"][:5])',
           (CTL + "cli/test_ctl_canary.py::test_a_running_canary_shows_its_latest_polls",),
           "`ctl canary` shows a running canary's first five polls, never the latest"),
    Mutant("ctl-canary-json-follows", "control/cli/ctl_canary.py",
           "    if args.detach or args.json:", "    if args.detach:",
           (CTL + "cli/test_ctl_canary.py::test_set_with_canary_and_json_prints_the_started"
            "_run_and_returns",),
           "`ctl set --canary N --json` prints text lines and blocks instead of the JSON run"),
    Mutant("ctl-canary-min-requests-dropped", "control/cli/ctl_canary.py",
           '        body["min_requests"] = args.min_requests', "        pass",
           (CTL + "cli/test_ctl_canary.py::test_set_with_canary_sends_the_replicas_window_and"
            "_min_requests",),
           "--min-requests is ignored: a canary decides on the default 10 requests a side"),
    Mutant("ctl-canary-default-watch-30s", "control/cli/ctl_canary.py",
           'parse_duration(args.watch or "5m")', 'parse_duration(args.watch or "30s")',
           (CTL + "cli/test_ctl_canary.py::test_set_with_canary_sends_the_replicas_window_and"
            "_min_requests",),
           "a canary without --watch is judged on 30 s of traffic, not the documented 5 min"),
    Mutant("redirect-suggests-the-asked-path", "control/cli/http_json.py",
           "suggested = target[:-len(path)] if path and target.endswith(path) else target",
           "suggested = target",
           (SEC + "test_cli_redirect.py::test_ctl_does_not_follow_a_redirect_with_its_token",),
           "after a redirect the CLI says to use --url HOST/control/config, which then 404s"),
    Mutant("serve-trace-mb-as-kib", "control/cli/main.py",
           "int(args.trace_max_mb * 2**20)", "int(args.trace_max_mb * 2**10)",
           (CTL + "cli/test_cli.py::test_serve_options_reach_the_server_settings_in_their"
            "_units",),
           "--trace-max-mb 500 keeps the trace under 500 KiB: retention deletes nearly all"),
    Mutant("serve-days-as-hours", "control/cli/main.py",
           '"h": 3600, "d": 86400}', '"h": 3600, "d": 3600}',
           (CTL + "cli/test_cli.py::test_serve_options_reach_the_server_settings_in_their"
            "_units",),
           "--trace-max-age 7d deletes trace rows after 7 hours"),
    Mutant("serve-watch-config-forced", "control/cli/main.py",
           "watch_config=not args.no_watch_config", "watch_config=True",
           (CTL + "cli/test_cli.py::test_serve_options_reach_the_server_settings_in_their"
            "_units",),
           "--no-watch-config is ignored: an edit of the YAML still reloads the live config"),
    Mutant("dashboard-token-env-dropped", "control/cli/dashboard.py",
           '"--", *source, "--token-env", args.token_env]', '"--", *source]',
           (SEC + "test_dashboard_host.py::test_streamlit_gets_the_token_variable_and_the"
            "_replica",),
           "`batchpilot dashboard --token-env OPS_TOKEN`: the Control page sends no token (401)"),
    Mutant("dashboard-replica-dropped", "control/cli/dashboard.py",
           'if getattr(args, "replica", None) is not None:', "if False:",
           (SEC + "test_dashboard_host.py::test_streamlit_gets_the_token_variable_and_the"
            "_replica",),
           "`batchpilot dashboard --replica 1` opens on the whole fleet, not that replica"),
    Mutant("checklist-gauge-max-not-sum", "control/checklist/checks_ops.py",
           "    return sum(values) if values else None",
           "    return max(values) if values else None",
           (CTL + "checklist/test_checklist.py::test_a_gauge_is_summed_over_its_labels",),
           "the checklist reads one label's KV blocks for the whole server's"),
    Mutant("checklist-board-rows-counted", "control/checklist/checks_ops.py",
           'panels = [x for x in json.loads(path.read_text())["panels"] if x["type"] != "row"]',
           'panels = json.loads(path.read_text())["panels"]',
           (CTL + "checklist/test_checklist.py::test_the_boards_panel_count_leaves_out_their"
            "_rows",),
           "the grafana_boards evidence counts a board's row headers as panels"),
    Mutant("checklist-recording-rule-breaks-alerts", "control/checklist/checks_ops.py",
           'rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}',
           'rules = {r["alert"]: r for g in groups for r in g["rules"]}',
           (CTL + "checklist/test_checklist.py::test_a_recording_rule_beside_the_alerts_is"
            "_not_a_broken_rules_file",),
           "a recording rule in alerts.yml fails alert_rules as 'not a Prometheus rules file'"),
    Mutant("checklist-required-series-ignored", "control/checklist/checks_ops.py",
           '        used.setdefault(name, []).append("the checklist spec")\n',
           "        pass\n",
           (CTL + "checklist/test_checklist.py::test_a_series_the_spec_requires_is_looked"
            "_for_too",),
           "the metrics item passes without the series the spec's `required` names"),
    Mutant("checklist-malformed-row-crashes", "control/checklist/evaluate.py",
           "except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:",
           "except (TypeError, ValueError) as exc:",
           (CTL + "checklist/test_checklist.py::test_a_malformed_evidence_row_is_needs"
            "_evidence_not_a_crash",),
           "one stored row missing a column crashes the whole checklist with a traceback"),
    Mutant("canary-page-seconds-as-ms", "dashboard/views/canary.py",
           '        return f"{value * 1000:,.1f} ms"', '        return f"{value:,.1f} ms"',
           ("tests/dashboard/test_dashboard_fleet_pages.py::test_the_canary_page_shows_the_last_decision"
            "_in_milliseconds",),
           "the Canary page shows a 400 ms TTFT p99 as 0.4 ms"),
    Mutant("canary-page-first-decision", "dashboard/views/canary.py",
           "    decision_section(decided[-1])", "    decision_section(decided[0])",
           ("tests/dashboard/test_dashboard_fleet_pages.py::test_the_canary_page_shows_the_last_decision"
            "_in_milliseconds",),
           "the Canary page's 'Last decision' is the fleet's first canary, not its latest"),
    Mutant("fleet-page-kv-ratio-as-percent", "dashboard/views/fleet.py",
           "\"KV usage\": f\"{100 * r['kv_usage']:.0f}%\"",
           "\"KV usage\": f\"{r['kv_usage']:.0f}%\"",
           ("tests/dashboard/test_dashboard_fleet_pages.py::test_the_fleet_page_shows_kv_usage_as_a"
            "_percentage",),
           "the Fleet page shows every replica's KV usage as 0% or 1%"),
    Mutant("overview-cancels-uncounted", "dashboard/views/overview.py",
           'done.get("timeout", 0) + done.get("cancelled", 0)', 'done.get("timeout", 0)',
           ("tests/dashboard/test_dashboard.py::test_overview_shows_the_workload_and_the"
            "_scheduler_its_steps",),
           "the Overview's 'Timeouts + cancels' leaves out every cancelled request"),
    Mutant("whatif-panel-token-dropped", "dashboard/whatif_panel.py",
           '    headers = {"Authorization": f"Bearer {token}"} if token else {}',
           "    headers = {}",
           ("tests/dashboard/test_dashboard_whatif.py::test_a_live_prediction_sends_the"
            "_operators_token",),
           "Predict and the What-if page fail with 401 on a server that has tokens"),
    Mutant("otel-untraced-counted-not-sampled", "control/otel/feed.py",
           'self.requests["not_sampled"] += rec.trace is not None',
           'self.requests["not_sampled"] += 1',
           (CTL + "otel/test_sampling_rule.py::test_the_sampling_counter_counts_only_requests"
            "_that_had_a_trace",),
           "requests that never had a trace count as sampled out in otel_requests_total"),
]
