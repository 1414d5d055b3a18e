"""The load tester's summary and the what-if replay (pass of 2026-12-07, late: each had one
planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

METRICS = "control/loadtest/metrics.py"
METRICS_T = CTL + "loadtest/test_loadtest_metrics.py"
EDGES_T = CTL + "loadtest/test_loadtest_metrics_edges.py"
RETRIES_T = CTL + "loadtest/test_loadtest_retries.py"
OK_ONLY_T = METRICS_T + "::test_ttft_tpot_itl_e2e_over_ok_requests"
GOODPUT_T = METRICS_T + "::test_goodput_counts_ok_requests_meeting_every_slo"
OUTCOMES_T = METRICS_T + "::test_outcomes_rates_and_throughput"
REPLAY = "control/whatif/replay.py"
REPLAY_T = CTL + "whatif/test_whatif_replay.py"
SELF_T = REPLAY_T + "::test_self_prediction_reproduces_the_recorded_run"
LENGTHS_T = (REPLAY_T + "::test_each_request_asks_for_its_own_length_or_its_lanes_median_as"
             "_its_outcome_says")

NUMBERS_MUTANTS: list[Mutant] = [
    # ---- the load tester's summary (control/loadtest/metrics.py) -------------------------
    Mutant("lt-percentile-nearest-below", METRICS, "np.percentile(values, PERCENTILES)",
           'np.percentile(values, PERCENTILES, method="lower")',
           (METRICS_T + "::test_percentiles_interpolate_linearly",),
           "p99 is the sample below the 99th rank, not interpolated: the tail reads low"),
    Mutant("lt-latency-of-failed-requests", METRICS,
           "streamed = [r for r in ok if r.planned.stream]",
           "streamed = [r for r in results if r.planned.stream]", (OK_ONLY_T,),
           "a cancelled stream's TTFT, TPOT and ITL go into the run's percentiles"),
    Mutant("lt-goodput-counts-failed-requests", METRICS,
           "good = sum(meets_slo(r, slo) for r in ok)",
           "good = sum(meets_slo(r, slo) for r in results)", (GOODPUT_T,),
           "a refused or timed-out request with no TPOT to miss counts as goodput"),
    Mutant("lt-tpot-missing-is-a-miss", METRICS,
           "return slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s",
           "return slo.tpot_s is None or tpot is not None and tpot <= slo.tpot_s",
           (GOODPUT_T,), "a one-token or non-streamed reply misses any TPOT target:"
           " goodput reads low"),
    Mutant("lt-tpot-slo-boundary-missed", METRICS, "tpot <= slo.tpot_s", "tpot < slo.tpot_s",
           (EDGES_T + "::test_a_tpot_exactly_at_its_target_meets_it",),
           "a request exactly at its TPOT target is counted as a miss"),
    Mutant("lt-request-rps-counts-refused", METRICS, "request_rps=len(ok) / duration_s",
           "request_rps=n / duration_s", (OUTCOMES_T,),
           "request_rps counts refused and timed-out requests as served"),
    Mutant("lt-output-of-cancelled-requests", METRICS,
           "output = sum(r.output_tokens for r in ok)",
           "output = sum(r.output_tokens for r in results)", (OUTCOMES_T,),
           "a cancelled stream's tokens count toward the output throughput"),
    Mutant("lt-outcome-rates-of-ok", METRICS, "return outcomes[outcome] / n if n else 0.0",
           "return outcomes[outcome] / len(ok) if ok else 0.0", (OUTCOMES_T,),
           "the rejected and timeout rates are shares of the ok requests: 1 in 8 reads 1 in 5"),
    Mutant("lt-prompt-tokens-planned-first", METRICS,
           "return r.prompt_tokens or r.planned.prompt_tokens",
           "return r.planned.prompt_tokens or r.prompt_tokens",
           (EDGES_T + "::test_prompt_tokens_are_the_servers_count_and_the_planned_length_only"
            "_without_usage",),
           "total_tps counts the planned prompt length, not what the server tokenized"),
    Mutant("lt-resent-ok-of-every-request", METRICS,
           "resent_ok=sum(r.sends > 1 for r in ok)",
           "resent_ok=sum(r.sends > 1 for r in results)",
           (RETRIES_T + "::test_resends_that_got_through_are_told_from_resends_refused_again",),
           "a resend that was refused again reads as a resend that got through"),
    Mutant("lt-ttft-gap-keeps-the-resend-wait", METRICS,
           "return r.ttft_s - r.last_send_s - r.server_ttft_s",
           "return r.ttft_s - r.server_ttft_s",
           (RETRIES_T + "::test_a_resent_requests_gap_to_the_server_leaves_out_its_wait"
            "_between_sends",),
           "a resent request's wait for Retry-After reads as delay the server does not see"),
    Mutant("lt-server-lane-groups-take-the-scenario-slo", METRICS,
           "lambda r: r.server_lane, duration_s, None, label)",
           "lambda r: r.server_lane, duration_s, slo, label)",
           (METRICS_T + "::test_without_a_scenario_slo_goodput_counts_each_lanes_own_from_the"
            "_server",),
           "the checklist judges each server lane by the load test's SLO, not the lane's own"),
    # ---- the what-if replay (control/whatif/replay.py) -----------------------------------
    Mutant("whatif-arrival-skips-tokenize", REPLAY,
           "entries = sorted((r.arrival_time + r.tokenize_s, i) for i, r in enumerate(reqs))",
           "entries = sorted((r.arrival_time, i) for i, r in enumerate(reqs))",
           (REPLAY_T + "::test_a_request_reaches_the_replay_after_its_recorded_tokenize_time",),
           "requests reach the replayed engine before the server tokenized them: every"
           " predicted TTFT is low by the tokenize time"),
    Mutant("whatif-every-end-is-a-cancel", REPLAY,
           '           if r.outcome == "cancelled" and r.finished_time is not None]',
           "           if r.finished_time is not None]", (SELF_T,),
           "every request is cut off at its recorded end: a slower config predicts cancels"
           " instead of longer latencies"),
    Mutant("whatif-cancel-wants-no-more", REPLAY,
           "out.append(max(median, r.num_output_tokens + 1))",
           "out.append(max(median, r.num_output_tokens))", (SELF_T,),
           "a request cancelled past its lane's median finishes just before its cancel"),
    Mutant("whatif-error-asks-the-median", REPLAY,
           'if r.outcome in ("finished", "error"):', 'if r.outcome == "finished":',
           (LENGTHS_T,), "a request that failed asks for its lane's median length, not its own"),
    Mutant("whatif-timeout-forgets-its-tokens", REPLAY,
           "out.append(max(median, r.num_output_tokens, 1))", "out.append(max(median, 1))",
           (LENGTHS_T,),
           "a request that timed out after a long answer is replayed as a short one"),
    Mutant("whatif-every-rejection-too-long", REPLAY,
           'elif r.finish_detail == "too_long":', 'elif r.outcome == "rejected":', (LENGTHS_T,),
           "a request refused for a full queue is replayed too long: refused in every config"),
    Mutant("whatif-deadline-dropped", REPLAY, "deadline=r.deadline, arrival_time",
           "deadline=None, arrival_time",
           (REPLAY_T + "::test_a_recorded_deadline_the_replay_cannot_make_ends_its_request",),
           "requests with a deadline never time out in the replay"),
    Mutant("whatif-lane-always-routed", REPLAY,
           "lane=r.lane if r.lane in lanes else None", "lane=None",
           (REPLAY_T + "::test_a_replayed_request_keeps_its_lane_and_priority_and_a_removed"
            "_lane_is_routed",),
           "every request is routed afresh: the batch lane's traffic lands in interactive"),
    Mutant("whatif-kv-peak-is-the-last-step", REPLAY,
           "kv_peak = max(kv_peak, done.kv_used)", "kv_peak = done.kv_used", (SELF_T,),
           "the predicted KV peak is the last step's, near empty"),
    Mutant("whatif-server-law-not-applied", REPLAY,
           "_engine(config, executor, clock, lean, window.step_law)",
           "_engine(config, executor, clock, lean)",
           (CTL + "whatif/test_whatif_step_law.py::test_self_prediction_under_the_law"
            "_reproduces_the_run_and_without_it_does_not",),
           "a server with fitted step budgets is replayed on the built-in ones"),
    Mutant("whatif-no-shared-prefix", REPLAY,
           "shared = min(r.num_cached_tokens, r.num_prompt_tokens)", "shared = 0", (SELF_T,),
           "the trace's prefix-cache hits are replayed as misses: prefill costs more"),
    Mutant("whatif-loop-gap-dropped", REPLAY,
           "clock.now += gap_s if done.tokens else IDLE_TICK_S",
           "clock.now += 0.0 if done.tokens else IDLE_TICK_S",
           (REPLAY_T + "::test_the_engine_loops_gap_follows_each_step_that_ran_tokens",),
           "the engine loop's time between steps is left out: every latency reads low"),
]
