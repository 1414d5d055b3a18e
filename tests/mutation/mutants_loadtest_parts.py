"""`make mutants` bugs in the load tester's scenario planner, SSE transport, report and
records and its client-cost note (hand-planted, first pass of 2026-12-07); each has a test
that fails on it. The fleet's and the checklist's of the same pass:
mutants_fleet_checklist.py."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

LOADTEST_PARTS_MUTANTS: list[Mutant] = [
    Mutant("scen-rate-zero-accepted", "control/loadtest/scenario.py",
           "rate > 0)", "rate >= 0)",
           (CTL + "loadtest/test_loadtest_scenario.py::test_load_scenario_file_errors",),
           "--rate 0 is taken: the plan's gaps divide by zero or never end"),
    Mutant("scen-bursts-every-s-inverted", "control/loadtest/scenario.py",
           "every_s=arrival.burst_size / rate", "every_s=rate / arrival.burst_size",
           (CTL + "loadtest/test_loadtest_scenario.py::test_bursts_send_burst_size_at_once_every"
                  "_every_s",),
           "--rate on a bursts scenario sets the wrong burst spacing: 20-request bursts at 4 "
           "req/s come every 0.2 s, not 5 s"),
    Mutant("scen-trace-rate-counts-first", "control/loadtest/scenario.py",
           "rate / ((len(times) - 1) / span)", "rate / (len(times) / span)",
           (CTL + "loadtest/test_loadtest_scenario.py::test_trace_replay_uses_the_trace_rows"
                  "_scaled",),
           "--rate on a trace replay counts the first arrival as a gap: the replay runs slower "
           "than asked"),
    Mutant("scen-scale-trace-multiplies", "control/loadtest/scenario.py",
           "time_scale=trace.time_scale / factor", "time_scale=trace.time_scale * factor",
           (CTL + "loadtest/test_loadtest_scenario.py::test_trace_replay_uses_the_trace_rows"
                  "_scaled",),
           "scaling a trace replay's rate stretches its times instead: 2x the rate arrives at "
           "half"),
    Mutant("scen-scale-bursts-multiplies", "control/loadtest/scenario.py",
           "every_s=arrival.every_s / factor", "every_s=arrival.every_s * factor",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_scale_rate_makes_bursts_come_that"
                  "_much_more_often",),
           "scale_rate on a bursts scenario spaces the bursts further apart instead of closer"),
    Mutant("scen-duration-end-exclusive", "control/loadtest/scenario.py",
           "arrival_s > s.duration_s", "arrival_s >= s.duration_s",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_a_burst_that_lands_on_the_duration"
                  "_is_sent",),
           "a burst (or arrival) landing exactly on duration_s is dropped from the plan"),
    Mutant("scen-rag-lane-ignored", "control/loadtest/scenario.py",
           'kind, lane = "rag", s.rag.lane or lane', 'kind = "rag"',
           (CTL + "loadtest/test_loadtest_scenario.py::test_ratios_of_stream_cancel_rag_tenants"
                  "_lanes",),
           "RAG requests go to the lane drawn for chat, not the scenario's rag.lane "
           "(long_context)"),
    Mutant("scen-auto-lane-sent", "control/loadtest/scenario.py",
           "lane=None if lane == AUTO_LANE else lane", "lane=lane",
           (CTL + "loadtest/test_loadtest_scenario.py::test_defaults_when_the_file_leaves_keys"
                  "_out",),
           "requests weighted to the auto lane are sent with lane 'auto', not left for the "
           "server to route"),
    Mutant("scen-ignore-eos-dropped", "control/loadtest/scenario.py",
           "kind=kind, ignore_eos=s.ignore_eos,", "kind=kind,",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_ignore_eos_off_reaches_every"
                  "_planned_request",),
           "ignore_eos: false in a scenario is ignored: every request still forces max_tokens"),
    Mutant("scen-uniform-max-excluded", "control/loadtest/scenario.py",
           "math.floor(dist.max)))", "math.floor(dist.max) - 1))",
           (CTL + "loadtest/test_loadtest_scenario.py::test_uniform_bounds_and_mean",),
           "a uniform length never reaches its max: outputs of 16..128 top out at 127"),
    Mutant("scen-lognormal-mean-of-log", "control/loadtest/scenario.py",
           "math.log(dist.mean) - dist.sigma**2 / 2", "math.log(dist.mean)",
           (CTL + "loadtest/test_loadtest_scenario.py::test_lognormal_mean_is_the_mean_of_the"
                  "_tokens",),
           "a lognormal length's mean is too high: mean 300 draws average ~410 tokens"),
    Mutant("scen-lognormal-unclipped", "control/loadtest/scenario.py",
           "return min(max(value, low), high)", "return value",
           (CTL + "loadtest/test_loadtest_scenario.py::test_lognormal_mean_is_the_mean_of_the"
                  "_tokens",),
           "a lognormal length passes its min/max: prompts longer than the model's context are "
           "planned"),
    Mutant("scen-zero-token-lengths", "control/loadtest/scenario.py",
           "return max(1, round(sample(dist, rng)))", "return round(sample(dist, rng))",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_a_length_that_rounds_to_zero_is"
                  "_one_token",),
           "a length that rounds to 0 plans max_tokens 0 or an empty prompt, which a server "
           "refuses"),
    Mutant("scen-cancel-ratio-inverted", "control/loadtest/scenario.py",
           'streams["cancel"].random() < s.cancel.ratio',
           'streams["cancel"].random() > s.cancel.ratio',
           (CTL + "loadtest/test_loadtest_scenario.py::test_ratios_of_stream_cancel_rag_tenants"
                  "_lanes",),
           "cancel ratio 0.05 cancels 95% of the requests"),
    Mutant("scen-trace-limit-ignored", "control/loadtest/scenario.py",
           "min(trace.limit or s.requests, s.requests)", "s.requests",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_a_trace_limit_caps_the_replay"
                  "_whatever_the_requests",),
           "trace.limit is ignored when requests is set: the replay sends rows past the limit"),
    Mutant("scen-trace-arrivals-without-rows", "control/loadtest/scenario.py",
           'uses = s.arrival.process == "trace" or "trace"', 'uses = "trace"',
           (CTL + "loadtest/test_scenario_plan_edges.py::test_a_trace_can_time_the_arrivals_of"
                  "_fixed_length_requests",),
           "a trace that times only the arrivals (fixed lengths) plans no request at all"),
    Mutant("scen-gamma-scale-unshaped", "control/loadtest/scenario.py",
           "scale = 1.0 / (arrival.rate * shape)", "scale = 1.0 / arrival.rate",
           (CTL + "loadtest/test_loadtest_scenario.py::test_gamma_mean_gap_and_burstier_than"
                  "_poisson",),
           "a gamma (bursty) arrival process runs at rate x burstiness, not the rate asked"),
    Mutant("scen-seed-ignored", "control/loadtest/scenario.py",
           'random.Random(f"{s.seed}:{name}")', "random.Random(name)",
           (CTL + "loadtest/test_loadtest_scenario.py::test_plan_is_deterministic_per_seed",),
           "the seed changes nothing: every seed plans the same requests"),
    Mutant("scen-shared-stream", "control/loadtest/scenario.py",
           'random.Random(f"{s.seed}:{name}") for name in', "random.Random(s.seed) for name in",
           (CTL + "loadtest/test_scenario_plan_edges.py::test_the_tenant_drawn_does_not_decide"
                  "_the_lane",),
           "every draw shares one random sequence: the tenant drawn decides the lane (and more)"),
    Mutant("spec-default-concurrency", "control/loadtest/scenario_spec.py",
           "DEFAULT_CONCURRENCY = 64", "DEFAULT_CONCURRENCY = 8",
           (CTL + "loadtest/test_loadtest_scenario.py::test_defaults_when_the_file_leaves_keys"
                  "_out",),
           "a scenario that sets no concurrency runs 8 requests in flight, not the documented 64"),
    Mutant("spec-default-lane-named", "control/loadtest/scenario_spec.py",
           "lanes: tuple[tuple[str, float], ...] = ((AUTO_LANE, 1.0),)",
           'lanes: tuple[tuple[str, float], ...] = (("interactive", 1.0),)',
           (CTL + "loadtest/test_loadtest_scenario.py::test_defaults_when_the_file_leaves_keys"
                  "_out",),
           "a scenario without lanes sends every request to the interactive lane instead of "
           "letting the server route"),
    Mutant("spec-auto-lane-renamed", "control/loadtest/scenario_spec.py",
           'AUTO_LANE = "auto"', 'AUTO_LANE = "any"',
           (CTL + "loadtest/test_loadtest_scenario.py::test_ratios_of_stream_cancel_rag_tenants"
                  "_lanes",),
           "lanes: {auto: 1} in a scenario sends lane 'auto' to the server instead of none"),
    Mutant("sse-crlf-in-name-allowed", "control/loadtest/sse_transport.py",
           'in name + value for c in "\\r\\n"', 'in value for c in "\\r\\n"',
           (CTL + "loadtest/test_sse_transport.py::test_a_header_cannot_split_the_request",),
           "a header name with CR/LF splits the request: a header the user never wrote is sent"),
    Mutant("sse-size-per-read", "control/loadtest/sse_transport.py",
           "self.size += len(data)", "self.size = len(data)",
           (CTL + "loadtest/test_sse_transport.py::test_a_reply_of_many_small_reads_is_bounded"
                  "_by_their_sum",),
           "a reply in many small reads is never cut: a server streaming without end fills the "
           "client's memory"),
    Mutant("sse-timeout-from-send", "control/loadtest/sse_transport.py",
           "last = recorder.reads[-1][0] if recorder.reads else sent_at", "last = sent_at",
           (CTL + "loadtest/test_sse_transport.py::test_a_stream_longer_than_the_timeout_is_read"
                  "_while_its_chunks_keep_coming",),
           "a stream longer than --timeout times out while its chunks still come"),
    Mutant("sse-chunk-size-decimal", "control/loadtest/sse_transport.py",
           'split(b";", 1)[0], 16)', 'split(b";", 1)[0], 10)',
           (CTL + "loadtest/test_loadtest_retries.py::test_refused_requests_are_sent_again_and"
                  "_timed_from_the_first_send",),
           "chunk sizes read as decimal: streamed replies parse garbled or fail"),
    Mutant("sse-chunk-crlf-skipped", "control/loadtest/sse_transport.py",
           "at = line_end + 2 + size + 2", "at = line_end + 2 + size",
           (CTL + "loadtest/test_loadtest_retries.py::test_refused_requests_are_sent_again_and"
                  "_timed_from_the_first_send",),
           "the CRLF after each chunk is read as the next chunk's size: a streamed reply breaks"),
    Mutant("sse-content-length-strict", "control/loadtest/sse_transport.py",
           "len(raw) - at >= length", "len(raw) - at > length",
           (CTL + "loadtest/test_sse_transport.py::test_a_refusal_with_a_content_length_body",),
           "a whole Content-Length reply (a 429 refusal) reads as cut short"),
    Mutant("sse-header-names-cased", "control/loadtest/sse_transport.py",
           "k.strip().lower().decode", "k.strip().decode",
           (CTL + "loadtest/test_sse_transport.py::test_each_line_is_timed_by_the_read_that"
                  "_completed_it",),
           "Retry-After and other headers are not found unless the server writes them lower-case"),
    Mutant("sse-line-timed-at-start", "control/loadtest/sse_transport.py",
           "end = min(lines_at + len(line), len(body) - 1)", "end = lines_at",
           (CTL + "loadtest/test_sse_transport.py::test_each_line_is_timed_by_the_read_that"
                  "_completed_it",),
           "an SSE line is timed by the read where it started: TTFT and ITL read early"),
    Mutant("sse-keep-alive", "control/loadtest/sse_transport.py",
           '"Content-Length: {len(payload)}", "Connection: close"]',
           '"Content-Length: {len(payload)}"]',
           (CTL + "loadtest/test_sse_transport.py::test_a_server_that_keeps_connections_open"
                  "_ends_the_reply_when_asked",),
           "requests do not say Connection: close: each reply waits for the server's keep-alive "
           "timeout"),
    Mutant("sse-not-closed-on-cancel", "control/loadtest/sse_transport.py",
           "    finally:\n        transport.close()\n",
           "    except ReplyTimeout:\n        transport.close()\n        raise\n",
           (CTL + "loadtest/test_loadtest_run.py::test_streams_cancellations_and_timing",),
           "a client that gives up leaves its connection open: the server keeps generating for "
           "it"),
    Mutant("sse-cut-reply-is-complete", "control/loadtest/sse_transport.py",
           "return spans, False", "return spans, True",
           (CTL + "loadtest/test_sse_transport.py::test_a_reply_cut_short_keeps_what_arrived_and"
                  "_says_so",),
           "a stream the server cut short reads as complete: it counts as ok"),
    Mutant("report-ratio-of-baseline-shown", "control/loadtest/report.py",
           '*map(fmt_ratio, row["ratios"][1:])', '*map(fmt_ratio, row["ratios"][:-1])',
           (CTL + "loadtest/test_loadtest_metrics.py::test_text_table_puts_configs_side_by_side",),
           "the ratio columns are shifted: each config's ratio is printed under the wrong config"),
    Mutant("report-fmt-2-digits", "control/loadtest/report.py",
           'return f"{value:.4g}"', 'return f"{value:.2g}"',
           (CTL + "loadtest/test_loadtest_gap.py::test_text_table_and_report_show_the_gap_next"
                  "_to_its_latency",),
           "report values keep 2 figures: 0.885 s shows as 0.89 and small changes vanish"),
    Mutant("report-outcomes-swapped", "control/loadtest/report.py",
           '("rejected", "timeout", "cancelled", "error")',
           '("rejected", "cancelled", "timeout", "error")',
           (CTL + "loadtest/test_loadtest_metrics.py::test_markdown_report_has_every_section",),
           "the by-lane table counts timeouts under cancelled and cancelled under timeout"),
    Mutant("report-group-missing-in-a-config", "control/loadtest/report.py",
           "for lab, s in zip(labels, summaries, strict=True) if g in getattr(s, attr)]",
           "for lab, s in zip(labels, summaries, strict=True)]",
           (CTL + "loadtest/test_loadtest_report.py::test_a_lane_one_config_never_ran_is_a_row"
                  "_for_the_other_alone",),
           "comparing configs that did not all run the same lanes or tenants crashes the report"),
    Mutant("report-partial-slo-is-none", "control/loadtest/report.py",
           "if not slo or all(v is None for v in slo.values()):",
           "if not slo or any(v is None for v in slo.values()):",
           (CTL + "loadtest/test_loadtest_metrics.py::test_without_a_scenario_slo_goodput_counts"
                  "_each_lanes_own_from_the_server",),
           "an SLO with only some targets set reads 'none given' in the report"),
    Mutant("report-configs-count-ok", "control/loadtest/report.py",
           "{s.requests} requests over", "{s.ok} requests over",
           (CTL + "loadtest/test_loadtest_report.py::test_the_configs_section_counts_every"
                  "_request_sent",),
           "the report's configs section says only the ok requests were sent"),
    Mutant("report-notes-dropped", "control/loadtest/report.py",
           '"\\n".join(f"- {n}" for n in notes) or "- none"', '"- none"',
           (CTL + "loadtest/test_loadtest_metrics.py::test_markdown_report_has_every_section",),
           "the report's scaling notes (prompt lengths scaled, ...) are left out"),
    Mutant("cc-share-ignores-cores", "control/loadtest/client_cost.py",
           "self.cpu_s / (self.wall_s * self.cores)", "self.cpu_s / self.wall_s",
           (CTL + "loadtest/test_loadtest_client_cost.py::test_a_loopback_run_that_took_a_share"
                  "_of_the_cores_warns",),
           "the client's CPU share ignores the cores: a 2-core run reports double its share"),
    Mutant("cc-remote-warns", "control/loadtest/client_cost.py",
           "if not same_machine(url) or share < WARN_SHARE:", "if share < WARN_SHARE:",
           (CTL + "loadtest/test_loadtest_client_cost.py::test_no_warning_for_a_remote_server_or"
                  "_an_idle_client",),
           "a run against a remote server warns that the client took the server's CPU"),
    Mutant("cc-private-is-local", "control/loadtest/client_cost.py",
           ".is_loopback", ".is_private",
           (CTL + "loadtest/test_loadtest_client_cost.py::test_same_machine_knows_loopback_and"
                  "_own_name",),
           "a server on another LAN machine (10.0.0.7) is treated as this one"),
    Mutant("cc-cores-of-machine", "control/loadtest/client_cost.py",
           "return len(os.sched_getaffinity(0))", "return os.cpu_count() or 1",
           (CTL + "loadtest/test_loadtest_client_cost.py::test_cores_are_those_this_process_may"
                  "_run_on_not_the_machines",),
           "in a container pinned to a few CPUs the client's share is of every machine core: "
           "understated"),
    Mutant("records-slo-default-zero", "control/loadtest/records.py",
           "    ttft_s: float | None = None\n    tpot_s: float | None = None\n",
           "    ttft_s: float | None = 0.0\n    tpot_s: float | None = None\n",
           (CTL + "loadtest/test_loadtest_metrics.py::test_a_latency_exactly_at_its_slo_meets_it",),
           "an SLO with no TTFT target judges every request against TTFT <= 0 s"),
]
