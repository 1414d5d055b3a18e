"""`make mutants` bugs in the operator's tools: the what-if, the load tester, the go-live
checklist and the simulator (hand-planted 2026-12-07, second pass): each one passed every
test then, and the test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

TOOLS_MUTANTS: list[Mutant] = [
    # ---- what-if, load test, checklist, simulator: survivors of a hand mutation pass ----
    Mutant("whatif-self-check-one-sided", "control/whatif/compare.py",
           "abs(b / a - 1) > SELF_ERROR_WARN", "b / a - 1 > SELF_ERROR_WARN",
           (CTL + "whatif/test_whatif_replay.py::test_a_self_prediction_that_misses_low_is"
            "_warned_about",),
           "a self-prediction far below the recorded latencies is reported as trustworthy"),
    Mutant("whatif-running-at-start-silent", "control/whatif/compare.py",
           "if window.facts.running_at_start:", "if False:",
           (CTL + "whatif/test_whatif_replay.py::test_requests_running_when_the_window_opened"
            "_are_a_warning",),
           "a window opened mid-traffic under-counts its load without a word"),
    Mutant("whatif-met-share-of-all", "control/whatif/summary.py",
           "good / len(done) if checked and done", "good / len(rows) if checked and done",
           (CTL + "whatif/test_whatif_summary.py::test_goodput_counts_finished_requests"
            "_meeting_every_target_e2e_included",),
           "slo_met_share is diluted by rejected and cancelled requests"),
    Mutant("whatif-queue-finished-only", "control/whatif/summary.py",
           'out["queue"] = _dist([r.queue for r in rows',
           'out["queue"] = _dist([r.queue for r in done',
           (CTL + "whatif/test_whatif_summary.py::test_queue_delay_is_over_every_scheduled"
            "_request_not_only_the_finished",),
           "queue delay leaves out the requests that gave up waiting: p99 reads low"),
    Mutant("whatif-e2e-slo-skipped", "control/whatif/summary.py",
           "if slo.e2e_s is not None and", "if False and",
           (CTL + "whatif/test_whatif_summary.py::test_goodput_counts_finished_requests"
            "_meeting_every_target_e2e_included",),
           "goodput counts requests over their E2E target"),
    Mutant("whatif-too-long-fits", "control/whatif/replay.py",
           "max_model_len - r.num_prompt_tokens + 1", "max_model_len - r.num_prompt_tokens",
           (CTL + "whatif/test_whatif_replay.py::test_a_too_long_rejection_asks_for_too_much"
            "_again",),
           "a request refused as too long is replayed as one that fits and runs"),
    Mutant("whatif-config-changes-off-by-one", "control/whatif/window.py",
           "max(int(agg[3]) - 1, 0)", "max(int(agg[3]), 0)",
           (CTL + "whatif/test_whatif_changes.py::test_a_change_inside_the_window_is_counted"
            "_once_and_none_is_none",),
           "every window is said to contain a config change it does not"),
    Mutant("whatif-gap-across-idle", "control/whatif/window.py",
           " & (left[:-1] > 0)", "",
           (CTL + "whatif/test_whatif_replay.py::test_the_engine_loops_gap_is_not_measured"
            "_across_idle_time",),
           "idle time between requests becomes the loop gap added after every predicted step"),
    Mutant("whatif-held-out-leaks", "control/whatif/calibrate.py",
           "_error(_fit_relative(X[~held], y[~held]) @ X[held].T, y[held])",
           "_error(coef @ X[held].T, y[held])",
           (CTL + "whatif/test_whatif_calibrate.py::test_the_held_out_error_is_of_a_fit_that"
            "_never_saw_those_steps",),
           "the held-out error is the in-sample one: a law that does not carry over looks fine"),
    Mutant("whatif-chunk-not-raised", "control/whatif/configs.py",
           "if facts.max_prefill_chunk > live.prefill_chunk_size:", "if False:",
           (CTL + "whatif/test_whatif_changes.py::test_a_chunk_larger_than_the_base_allows"
            "_sets_the_recorded_chunk_size",),
           "the replay splits prompts at a chunk size the server was not running"),
    Mutant("whatif-capacity-floor-wrong-end", "control/whatif/report.py",
           'cap == capacity["rates"][-1]', 'cap == capacity["rates"][0]',
           (CTL + "whatif/test_whatif_capacity.py::test_a_capacity_at_the_highest_rate_swept"
            "_is_a_floor",),
           "a capacity at the top swept rate is printed as a ceiling, the lowest as 'at least'"),
    Mutant("loadtest-duration-from-last-send", "control/loadtest/runner.py",
           "(max(ends) - min(sent))", "(max(ends) - max(sent))",
           (CTL + "loadtest/test_loadtest_run.py::test_streams_cancellations_and_timing",),
           "a run's duration shrinks to its last request: every rate and goodput reads high"),
    Mutant("loadtest-resent-ttft-from-last-send", "control/loadtest/runner.py",
           "result.ttft_s = result.last_send_s + result.server_ttft_s",
           "result.ttft_s = result.server_ttft_s",
           (CTL + "loadtest/test_loadtest_gap.py::test_a_whole_reply_resent_counts_its_ttft"
            "_from_the_first_send",),
           "a resent non-streamed request's TTFT hides the Retry-After wait its user had"),
    Mutant("loadtest-cancel-after-always", "control/loadtest/store.py",
           '"cancelled_after_s": p.cancel_after_s if r.outcome == "cancelled" else None',
           '"cancelled_after_s": p.cancel_after_s',
           (CTL + "loadtest/test_loadtest_metrics.py::test_a_planned_cancel_is_stored_only_for"
            "_requests_that_were_cancelled",),
           "requests that finished before their planned cancel are stored as cancelled after it"),
    Mutant("checklist-runs-oldest-first", "control/checklist/evidence.py",
           'ev.loadtest_runs.sort(key=lambda r: r.get("started") or 0.0, reverse=True)',
           'ev.loadtest_runs.sort(key=lambda r: r.get("started") or 0.0)',
           (CTL + "checklist/test_checklist_cli.py::test_the_newest_load_test_is_the_one_judged",),
           "the go-live checklist judges the oldest load test as the latest"),
    Mutant("checklist-stats-oldest-first", "control/checklist/evidence.py",
           'key=lambda r: r.get("first_sent") or 0.0, reverse=True)',
           'key=lambda r: r.get("first_sent") or 0.0)',
           (CTL + "checklist/test_checklist_cli.py::test_the_newest_load_test_is_the_one_judged",),
           "long_prompts and real_lengths judge an old run's stats before today's"),
    Mutant("checklist-loadtest-without-ok", "control/checklist/checks_loadtest.py",
           'r["requests"] >= p["min_requests"] and r["ok"]]', 'r["requests"] >= p["min_requests"]]',
           (CTL + "checklist/test_checklist.py::test_each_reason_fails_its_item_and_shows_the"
            "_value",),
           "a load test whose every request failed counts as one that was run"),
    Mutant("checklist-slo-judges-old-runs", "control/checklist/checks_loadtest.py",
           'latest = [r for r in rows if r["run_id"] == rows[0]["run_id"]]', "latest = rows",
           (CTL + "checklist/test_checklist.py::test_latency_is_judged_on_the_latest_run_only",),
           "an old run over its SLO fails today's latency item"),
    Mutant("checklist-long-prompts-off-by-one", "control/checklist/checks_loadtest.py",
           's["long_prompts"] < p["min_long_prompts"]',
           's["long_prompts"] <= p["min_long_prompts"]',
           (CTL + "checklist/test_checklist.py::test_each_reason_fails_its_item_and_shows_the"
            "_value",),
           "a run with exactly min_long_prompts long prompts is not judged: needs-evidence"),
    Mutant("checklist-prediction-covers-any-key", "control/checklist/checks_whatif.py",
           "return bool(change) and all(key in prediction",
           "return bool(change) and any(key in prediction",
           (CTL + "checklist/test_change_predicted.py::test_an_unpredicted_latest_change_fails"
            "_naming_it",),
           "a change predicted in part (one of its keys) passes as predicted"),
    Mutant("sim-percentile-rank-off", "engine/sim/stats.py",
           "pos = (len(xs) - 1) * q / 100.0", "pos = len(xs) * q / 100.0 - 1",
           (ENG + "test_sim_stats.py::test_percentiles_interpolate_between_the_ranks",),
           "the simulator's p50/p95/p99 land a rank low"),
    Mutant("sim-table-in-seconds", "engine/sim/stats.py",
           'vals = [row[f"{fld}_p{q}"] * 1000 for q in (50, 95, 99)]',
           'vals = [row[f"{fld}_p{q}"] for q in (50, 95, 99)]',
           (ENG + "test_sim_stats.py::test_the_table_is_by_lane_and_its_text_in_milliseconds",),
           "the demo's latency table headed (ms) prints seconds"),
    Mutant("sim-noise-mean-not-one", "engine/sim/step_cost.py",
           "lognormvariate(-self.noise ** 2 / 2, self.noise)",
           "lognormvariate(self.noise ** 2 / 2, self.noise)",
           (ENG + "test_sim_step_cost.py::test_the_noise_has_mean_one_and_is_seeded",),
           "a noisy simulated step costs exp(sigma^2) more on average than its law"),
]
