"""Mutants for the trace CLI, the what-if report, the load tester's store, the checklist spec, the
API's response schemas and the dashboard's what-if panel (pass of 2026-12-08: each module had at
most one planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

TRACE_CLI = "control/trace/cli.py"
TCLI_T = CTL + "trace/test_trace_cli.py"
TEDGE_T = CTL + "trace/test_trace_cli_edges.py"
REPORT = "control/whatif/report.py"
CAP_T = CTL + "whatif/test_whatif_capacity.py"
WEDGE_T = CTL + "whatif/test_whatif_report_edges.py"
STORE = "control/loadtest/store.py"
METRICS_T = CTL + "loadtest/test_loadtest_metrics.py"
GAP_T = CTL + "loadtest/test_loadtest_gap.py"
SEDGE_T = CTL + "loadtest/test_loadtest_store_edges.py"
SPEC = "control/checklist/spec.py"
SPEC_T = CTL + "checklist/test_checklist_spec.py"
CEDGE_T = CTL + "checklist/test_checklist_spec_edges.py"
SCHEMAS = "control/api/response_schemas.py"
AEDGE_T = CTL + "api/test_response_schemas_edges.py"
PANEL = "dashboard/whatif_panel.py"
DASH_T = "tests/dashboard/test_dashboard_whatif.py"
PEDGE_T = "tests/dashboard/test_whatif_panel_edges.py"
LAW_T = WEDGE_T + "::test_the_step_law_and_its_gap_print_in_milliseconds"
REFUSED_T = CEDGE_T + "::test_blank_text_an_empty_section_and_an_unknown_key_are_refused"
NULL_T = AEDGE_T + "::test_a_phase_never_reached_and_a_target_not_set_are_null"
REQUIRED_T = AEDGE_T + "::test_openapi_requires_what_every_answer_carries"
TABLE_T = PEDGE_T + "::test_the_table_keeps_a_row_with_a_gap_and_shows_no_value_as_a_dash"

REPORTS_MUTANTS: list[Mutant] = [
    # ---- `batchpilot trace` (control/trace/cli.py) -----------------------------------------
    Mutant("trace-summary-window-ignored", TRACE_CLI,
           'source.ask("summary", since=args.since, until=args.until)',
           'source.ask("summary", since=None, until=None)',
           (TEDGE_T + "::test_a_summary_covers_only_its_window",),
           "summary --since/--until summarizes the whole trace: a postmortem of one incident"
           " reads the day's averages"),
    Mutant("trace-slow-until-dropped", TRACE_CLI,
           'source.ask("slow", since=args.since, until=args.until, limit=args.limit,',
           'source.ask("slow", since=args.since, until=None, limit=args.limit,',
           (TCLI_T + "::test_bad_values_are_usage_errors_naming_what_is_wrong",),
           "slow --until is ignored: the slowest requests come from after the window asked"),
    Mutant("trace-slow-by-ignored", TRACE_CLI, "                      by=args.by)",
           '                      by="e2e_s")',
           (TEDGE_T + "::test_slow_by_ttft_ranks_by_time_to_first_token",),
           "slow --by ttft_s still ranks by end-to-end time: the slow starts are not listed"),
    Mutant("trace-slow-default-limit", TRACE_CLI,
           'p.add_argument("--limit", type=int, default=10, metavar="N", help="default'
           ' %(default)s")',
           'p.add_argument("--limit", type=int, default=5, metavar="N", help="default'
           ' %(default)s")',
           (TEDGE_T + "::test_slow_lists_up_to_ten_requests_by_default",),
           "slow without --limit lists 5 requests, not the 10 its help promises"),
    Mutant("trace-steps-before-after-swapped", TRACE_CLI,
           "before=args.before, after=args.after", "before=args.after, after=args.before",
           (TCLI_T + "::test_steps_around_a_moment_and_in_a_window",),
           "steps --before 2 --after 3 shows 3 steps before the moment and 2 after"),
    Mutant("trace-steps-window-batch-dropped", TRACE_CLI,
           "                          batch=args.batch)",
           "                          batch=False)",
           (TEDGE_T + "::test_steps_in_a_window_with_batch_list_the_requests_that_ran",),
           "steps --since T --batch lists no request under each step"),
    Mutant("trace-error-exit-always-2", TRACE_CLI, "        return exc.code",
           "        return 2", (TCLI_T + "::test_an_unknown_request_exits_1_from_either_source",),
           "a request not in the trace, or a server that is down, exits 2 as a usage error:"
           " scripts retry a typo and give up on an outage"),
    Mutant("trace-no-subcommand-exit-0", TRACE_CLI,
           "        args.trace_parser.print_help(sys.stderr)\n        return 2",
           "        args.trace_parser.print_help(sys.stderr)\n        return 0",
           (TEDGE_T + "::test_trace_without_a_subcommand_prints_help_and_exits_2",),
           "`batchpilot trace` with no subcommand prints help and exits 0: a script that lost"
           " its subcommand passes"),
    Mutant("trace-token-env-ignored", TRACE_CLI,
           'token = os.environ.get(getattr(args, "token_env", None) or TOKEN_ENV)',
           "token = os.environ.get(TOKEN_ENV)",
           (TEDGE_T + "::test_token_env_names_the_variable_holding_the_read_token",),
           "--token-env NAME is ignored: an operator with the read token in another variable"
           " gets 401"),
    # ---- the what-if report (control/whatif/report.py) ----------------------------------
    Mutant("whatif-ratio-header-over-predicted", REPORT, 'else f"{c}/{baseline}"',
           'else f"{c}/{PREDICTED}"',
           (CAP_T + "::test_rate_scale_puts_the_proposal_beside_the_recorded_config_at_that"
            "_rate",),
           "under --rate-scale the proposal's ratio is headed proposed/predicted though it"
           " divides by as-is@Kx"),
    Mutant("whatif-baseline-ratio-column-kept", REPORT,
           "return [c for c in columns[1:] if c == PREDICTED or c != baseline]",
           "return [c for c in columns[1:]]",
           (CAP_T + "::test_rate_scale_puts_the_proposal_beside_the_recorded_config_at_that"
            "_rate",),
           "under --rate-scale the table grows an as-is@Kx/as-is@Kx column of dashes"),
    Mutant("whatif-one-sided-group-kept", REPORT,
           "if any(s is None for s in sub.values()):",
           "if all(s is None for s in sub.values()):",
           (WEDGE_T + "::test_a_lane_only_some_columns_have_is_left_out",),
           "a proposal that removes a lane crashes the report instead of leaving that lane out"),
    Mutant("whatif-group-tables-unfiltered", REPORT,
           'rows = [r for r in ratio_rows(sub, baseline=baseline) if r["metric"] in'
           " GROUP_METRICS]",
           "rows = ratio_rows(sub, baseline=baseline)",
           (WEDGE_T + "::test_each_lane_and_tenant_table_shows_the_group_metrics",),
           "each lane's and tenant's table repeats every metric: the per-lane view is 25 rows"),
    Mutant("whatif-gap-in-seconds", REPORT, "f\"; gap {cal['gap_s'] * 1e3:.3g} ms\"",
           "f\"; gap {cal['gap_s']:.3g} ms\"",
           (LAW_T,),
           "the step gap is printed in seconds labelled ms: 2 ms reads 0.002 ms"),
    Mutant("whatif-coefficients-in-seconds", REPORT, 'f"{k} {v * 1e3:.4g} ms"',
           'f"{k} {v:.4g} ms"', (LAW_T,),
           "the step-time law's coefficients are seconds labelled ms: a 4 ms step reads 0.004"),
    Mutant("whatif-held-out-shows-in-sample", REPORT,
           "f\" ({held['steps']} steps): median {fmt_value(held['median_abs_pct'])}%, p90\"",
           "f\" ({held['steps']} steps): median {fmt_value(fit['median_abs_pct'])}%, p90\"",
           (WEDGE_T + "::test_the_held_out_error_is_the_held_out_steps",),
           "the held-out error shows the in-sample one: an overfit law looks trustworthy"),
    Mutant("whatif-warnings-dropped", REPORT,
           'lines += [""] + [f"WARNING: {w}" for w in result["warnings"]]', 'lines += [""]',
           (WEDGE_T + "::test_every_warning_is_printed",),
           "the text report leaves out its warnings (a self-prediction off by 20%, steps"
           " beyond the fit): a reviewer trusts numbers the tool doubts"),
    Mutant("whatif-capacity-plot-ttft-is-e2e", REPORT,
           'ttft.plot(rates, [float("nan") if r["ttft_p99_s"] is None else r["ttft_p99_s"]',
           'ttft.plot(rates, [float("nan") if r["e2e_p99_s"] is None else r["e2e_p99_s"]',
           (WEDGE_T + "::test_the_capacity_plot_draws_goodput_and_ttft_p99_against_rate",),
           "the capacity plot's TTFT p99 panel draws E2E p99"),
    Mutant("whatif-latency-bars-all-recorded", REPORT,
           'dist = result["summaries"][col][name]',
           'dist = result["summaries"][columns[0]][name]',
           (WEDGE_T + "::test_the_latency_plot_has_each_columns_own_percentiles",),
           "every bar of the latency plot is the recorded run's: proposals look identical"),
    # ---- the load tester's store (control/loadtest/store.py) ----------------------------
    Mutant("store-started-at-last-send", STORE, "started = min(sent) if sent else None",
           "started = max(sent) if sent else None",
           (METRICS_T + "::test_store_saves_what_rows_for_api_returns",),
           "a run's start is its last request's send: runs sort and window wrongly"),
    Mutant("store-itl-mean-is-max", STORE,
           '"itl_mean_s": sum(itls) / len(itls) if itls else None,',
           '"itl_mean_s": max(itls) if itls else None,',
           (METRICS_T + "::test_store_saves_what_rows_for_api_returns",),
           "each request's stored mean inter-token latency is its worst gap"),
    Mutant("store-p99-column-holds-p50", STORE,
           'row[f"{name}_p50"], row[f"{name}_p99"] = dist.p50, dist.p99',
           'row[f"{name}_p50"], row[f"{name}_p99"] = dist.p50, dist.p50',
           (METRICS_T + "::test_store_saves_what_rows_for_api_returns",),
           "the stored p99 columns hold the median: tails vanish from saved runs"),
    Mutant("store-run-row-doubled", STORE, "    insert_runs(con, [rows])",
           "    insert_runs(con, [rows, rows])",
           (METRICS_T + "::test_save_to_file_appends_runs",),
           "each save stores the run and its requests twice: every count doubles"),
    Mutant("store-failed-requests-dropped", STORE,
           "REQUESTS_TABLE: [_request_row(run_id, label, r) for r in results]}",
           'REQUESTS_TABLE: [_request_row(run_id, label, r) for r in results if r.outcome =='
           ' "ok"]}',
           (METRICS_T + "::test_save_to_file_appends_runs",),
           "refused, timed-out and cancelled requests are not stored: the run looks clean"),
    Mutant("store-no-rollback", STORE,
           "    except BaseException:\n        con.rollback()\n        raise",
           "    except BaseException:\n        raise",
           (SEDGE_T + "::test_a_save_that_fails_half_way_stores_nothing_and_the_next_one_works",),
           "a save that fails half way leaves the connection in an aborted transaction:"
           " every later save on it fails"),
    Mutant("store-old-tables-not-migrated", STORE,
           "            con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS \"{name}\""
           " {kind}')",
           "            pass",
           (GAP_T + "::test_tables_from_before_the_gap_get_its_columns",),
           "a results file from an older batchpilot can no longer be saved to"),
    Mutant("store-gaps-swapped", STORE,
           '"ttft_gap_s": ttft_gap_s(r), "e2e_gap_s": e2e_gap_s(r)',
           '"ttft_gap_s": e2e_gap_s(r), "e2e_gap_s": ttft_gap_s(r)',
           (GAP_T + "::test_store_keeps_server_timing_and_gaps",),
           "the stored TTFT gap is the E2E one and back: the network's share is misread"),
    Mutant("store-prompt-tokens-planned", STORE, '"prompt_tokens": r.prompt_tokens',
           '"prompt_tokens": p.prompt_tokens',
           (SEDGE_T + "::test_stored_prompt_tokens_are_the_servers_count",),
           "stored prompt tokens are the planned lengths, not the server's count: a refused"
           " request shows a prompt it never tokenized"),
    # ---- the checklist spec (control/checklist/spec.py) ---------------------------------
    Mutant("checklist-duplicate-ids-allowed", SPEC, "    seen.add(item_id)\n", "",
           (SPEC_T + "::test_spec_rejects_duplicate_ids_and_accepts_a_null_threshold",),
           "two items with one id both load: the report shows one result for two checks"),
    Mutant("checklist-null-for-any-param", SPEC,
           "if value is None and key in check.nullable:", "if value is None:",
           (CEDGE_T + "::test_a_null_is_refused_where_the_parameter_takes_none",),
           "min_gap: null loads and the check crashes on None at run time"),
    Mutant("checklist-defaults-over-spec", SPEC, "{**check.defaults, **given})",
           "{**given, **check.defaults})",
           (SPEC_T + "::test_spec_rejects_duplicate_ids_and_accepts_a_null_threshold",),
           "the spec's thresholds are overwritten by the defaults: an edited threshold does"
           " nothing"),
    Mutant("checklist-choice-unchecked", SPEC,
           "if key in check.choices and value not in check.choices[key]:",
           "if key in check.choices and value is None:",
           (SPEC_T + "::test_spec_errors_name_the_item_and_field",),
           "targets: lane (a typo) loads, and the check then judges by neither lanes nor"
           " fixed targets"),
    Mutant("checklist-int-not-a-number", SPEC,
           "ok = isinstance(value, int | float) and not isinstance(value, bool)",
           "ok = isinstance(value, float)",
           (CEDGE_T + "::test_an_int_is_a_number_for_a_float_parameter_and_an_int_one",),
           "min_requests: 20 or min_gap: 0 is refused as not a number"),
    Mutant("checklist-blank-text-accepted", SPEC,
           "if not isinstance(value, str) or not value.strip():",
           "if not isinstance(value, str) or not value:",
           (REFUSED_T,),
           "an item whose title or why is only spaces loads: the report shows a blank line"),
    Mutant("checklist-empty-section-accepted", SPEC,
           'if not isinstance(raw.get("items"), list) or not raw["items"]:',
           'if not isinstance(raw.get("items"), list):',
           (REFUSED_T,),
           "a section whose items were lost in an edit loads and passes with nothing checked"),
    Mutant("checklist-unknown-section-key-ignored", SPEC,
           "        _no_unknown(where, raw, SECTION_KEYS)\n", "",
           (REFUSED_T,),
           "a misspelled section key (itmes:) is ignored silently"),
    Mutant("checklist-yaml-line-off-by-one", SPEC, "at line {mark.line + 1}",
           "at line {mark.line}",
           (CEDGE_T + "::test_a_yaml_error_names_the_line_and_column_of_the_bad_key",),
           "a YAML error names the line above the bad one"),
    # ---- the API's response schemas (control/api/response_schemas.py) -------------------
    Mutant("schema-completion-tokens-float", SCHEMAS, "    completion_tokens: int\n",
           "    completion_tokens: float\n",
           (AEDGE_T + "::test_token_counts_are_documented_and_sent_as_integers",),
           "usage.completion_tokens is a float in every answer (3.0): typed clients reject it"),
    Mutant("schema-timing-unreached-zero", SCHEMAS, "    queue_delay_s: float | None = None",
           "    queue_delay_s: float = 0.0", (NULL_T,),
           "a request refused before it queued reports a queue delay of 0 s, not null"),
    Mutant("schema-slo-tpot-zero", SCHEMAS,
           "    tpot_s: float | None = None\n\n\nclass BatchpilotInfo",
           "    tpot_s: float = 0.0\n\n\nclass BatchpilotInfo", (NULL_T,),
           "a lane with a TTFT target only tells clients its TPOT target is 0 s: the load"
           " tester counts every request as missing it"),
    Mutant("schema-priority-optional", SCHEMAS, "    priority: int\n",
           "    priority: int | None = None\n", (REQUIRED_T,),
           "/openapi.json says the batchpilot object may leave out priority"),
    Mutant("schema-chat-usage-optional", SCHEMAS,
           "    usage: Usage\n    batchpilot: BatchpilotInfo\n",
           "    usage: Usage | None = None\n    batchpilot: BatchpilotInfo\n", (REQUIRED_T,),
           "/openapi.json says a chat answer may come without usage: generated clients make"
           " it optional"),
    Mutant("schema-error-param-required", SCHEMAS,
           "    param: str | None = None\n    code: str | None = None",
           "    param: str | None\n    code: str | None = None", (REQUIRED_T,),
           "/openapi.json says every error names a param: a client validating errors rejects"
           " one about the whole request"),
    Mutant("schema-logprob-bytes-optional", SCHEMAS, "    bytes: list[int]\n",
           "    bytes: list[int] | None = None\n", (REQUIRED_T,),
           "/openapi.json lets a top logprob leave out its bytes, which OpenAI's shape requires"),
    Mutant("schema-model-len-optional", SCHEMAS, "    max_model_len: int\n",
           "    max_model_len: int | None = None\n", (REQUIRED_T,),
           "/openapi.json says /v1/models may leave out max_model_len, which vLLM clients"
           " size prompts by"),
    Mutant("schema-owned-by-wrong", SCHEMAS, 'owned_by: str = "batchpilot"',
           'owned_by: str = "system"', (AEDGE_T + "::test_models_are_owned_by_batchpilot",),
           "/v1/models says the model is owned by 'system', not 'batchpilot'"),
    # ---- the dashboard's what-if panel (dashboard/whatif_panel.py) ----------------------
    Mutant("panel-fewer-seqs-not-fewer", PANEL, 'f"max_num_seqs={max(seqs // 2, 1)}"',
           'f"max_num_seqs={max(seqs, 1)}"',
           (PEDGE_T + "::test_the_first_rows_halve_the_current_budgets",),
           "the What-if page's first row, fewer_seqs, proposes the current max_num_seqs"),
    Mutant("panel-row-without-settings", PANEL, "if not name or not settings:",
           "if not name:", (DASH_T + "::test_rows_parse_like_the_cli_and_name_a_bad_row",),
           "a row with a name and no settings is refused with the CLI's KEY=VALUE wording,"
           " not naming the row"),
    Mutant("panel-401-not-a-token-problem", PANEL, "if status in (401, 403):",
           "if status == 403:", (PEDGE_T + "::test_a_missing_token_is_worded_as_a_token_problem",),
           "a missing token (401) reads 'the prediction failed', not 'the server refused the"
           " token'"),
    Mutant("panel-every-400-an-empty-window", PANEL,
           'if status == 400 and "no request arrived" in message:', "if status == 400:",
           (DASH_T + "::test_each_failure_is_worded_for_the_operator",),
           "an invalid setting is shown as 'choose a wider window'"),
    Mutant("panel-slo-nulls-sent", PANEL,
           'body["slo"] = {k: v for k, v in vars(slo).items() if v is not None}',
           'body["slo"] = dict(vars(slo))',
           (PEDGE_T + "::test_an_slo_goes_with_only_the_targets_it_sets",),
           "an SLO with only a TTFT target goes as tpot_s: null, e2e_s: null"),
    Mutant("panel-baseline-over-itself", PANEL, "            elif c != baseline:",
           "            else:",
           (PEDGE_T + "::test_under_a_rate_scale_proposals_are_divided_by_as_is_at_that_rate",),
           "under a rate scale the table has an as-is@Kx / as-is@Kx column of NONE"),
    Mutant("panel-p99-bars-show-p50", PANEL,
           '"seconds": result["summaries"][c][name][s]}',
           '"seconds": result["summaries"][c][name]["p50"]}',
           (PEDGE_T + "::test_the_charts_show_each_configs_own_percentiles",),
           "the charts' p99 bars are the medians: tails look as good as the middle"),
    Mutant("panel-rows-with-a-gap-dropped", PANEL,
           "table = table[~table.map(_missing).all(axis=1)]",
           "table = table[~table.map(_missing).any(axis=1)]",
           (TABLE_T,),
           "a row with one missing ratio (0 rejected / 0) disappears from the table"),
    Mutant("panel-nan-shown", PANEL,
           "return value is None or (isinstance(value, float) and math.isnan(value))",
           "return value is None",
           (TABLE_T,),
           "a ratio with no value shows 'nanx' in the table"),
]
