"""`make mutants` bugs in the engine's calibration, scheduling, lanes and output
(hand-planted 2026-12-07, second pass): each one passed every test then, and the test it
names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

ENGINE_MUTANTS: list[Mutant] = [
    # ---- the step law and its calibration -------------------------------------------------
    Mutant("recovery-anchors-below-startup", "engine/calibration/online_law.py",
           "base, scale = self.startup, max(1.0, _median_ratio(self.startup, steps))",
           "base, scale = self.startup, _median_ratio(self.startup, steps)",
           (ENG + "test_online_law.py::test_after_a_busy_spell_prompts_are_never_priced_below"
            "_the_start_up_law",),
           "after a busy spell, cheap decodes price prompts below the idle machine's law:"
           " steps with a prompt run far over the target"),
    Mutant("recovering-from-the-startup-law", "engine/calibration/online_law.py",
           "recovering = ratio < 1.0 and self.startup is not None and current != self.startup",
           "recovering = ratio < 1.0 and self.startup is not None",
           (ENG + "test_online_law.py::test_a_faster_machine_is_not_trusted_from_one_window",),
           "one window of fast steps loosens every budget past the start-up law"),
    Mutant("affordable-chunk-half-pair", "engine/calibration/step_law.py",
           "self.token_s + self.prefill_pair_s * (start + 0.5)",
           "self.token_s + self.prefill_pair_s * start",
           (ENG + "test_step_time.py::test_a_chunk_priced_by_attention_alone_is_afforded_no"
            "_token_too_many",),
           "a chunk is afforded a token more than the step's time allows"),
    Mutant("law-error-one-sided", "engine/calibration/step_law.py",
           "worst = max(worst, abs(predicted - p.seconds)",
           "worst = max(worst, (predicted - p.seconds)",
           (ENG + "test_step_time.py::test_the_laws_error_counts_steps_it_under_predicts",),
           "the fit's law_max_error_pct reads 0% for a law that under-predicts every step"),
    Mutant("fit-budget-without-a-third", "engine/calibration/budget_fit.py",
           'floor = chunk if "prefill_chunk_size" in kept else math.ceil(chunk / CHUNK_SHARE)',
           "floor = chunk",
           (CTL + "serve/test_budget_fitting.py::test_a_device_too_slow_for_one_chunk_still"
            "_leaves_a_third_beside_it",),
           "on a very slow device a long prompt's chunks take whole steps"),
    # ---- one step's time --------------------------------------------------------------------
    Mutant("victim-time-not-given-back", "engine/scheduling/budget.py",
           "        if self.time is not None:\n            self.time.give_back(",
           "        if False:\n            self.time.give_back(",
           (ENG + "test_step_time.py::test_a_preemption_victim_takes_its_decode_out_of_the"
            "_steps_prediction",),
           "a preemption victim's work stays in the step's prediction (and what it learns)"),
    Mutant("decode-share-of-the-whole-target", "engine/scheduling/step_time.py",
           "DECODE_SHARE * (target_s - law.fixed_s)", "DECODE_SHARE * target_s",
           (ENG + "test_step_time.py::test_the_decode_share_is_of_the_time_a_step_has_beside"
            "_its_fixed_cost",),
           "running decodes may take more than half of a step's time beside its fixed cost"),
    Mutant("starts-not-counted-in-the-share", "engine/scheduling/step_time.py",
           "self.running_decode_s += self.law.decode_s(req.num_tokens)",
           "self.running_decode_s += 0.0",
           (ENG + "test_step_time.py::test_requests_started_in_a_step_count_against_the_decode"
            "_share_of_the_next_start",),
           "a burst of long prompts all start in one step, past the decode share"),
    # ---- SLO deferral -------------------------------------------------------------------------
    Mutant("deferred-start-forgets-the-wait", "engine/scheduling/slo_estimates.py",
           "measured = waited + (deferred + own) / spare", "measured = (deferred + own) / spare",
           (ENG + "test_slo_deferral.py::test_the_device_time_deferred_requests_get_counts_from"
            "_the_requests_arrival",),
           "a request that already waited is deferred, then times out in the queue"),
    Mutant("spare-rate-work-never-fades", "engine/scheduling/spare_rate.py",
           "            self._work *= keep\n", "",
           (ENG + "test_slo_deferral.py::test_the_spare_rate_falls_while_deferred_requests_wait"
            "_and_none_starts",),
           "an old burst's device time keeps admitting deferred requests that time out"),
    # ---- update, queue timeouts, tenants, routing -----------------------------------------------
    Mutant("ttft-reset-on-recompute", "engine/scheduling/apply_sampled.py",
           "            if req.first_token_time is None:\n                req.first_token_time",
           "            if True:\n                req.first_token_time",
           (ENG + "test_scenarios.py::test_a_preempted_requests_ttft_stays_the_time_of_its_first"
            "_token",),
           "a preempted request's TTFT becomes the time it resumed"),
    Mutant("timed-out-twice", "engine/lanes/queue_timeouts.py",
           "if not _gone(req) and id(req) not in taken:", "if not _gone(req):",
           (ENG + "test_queue_timeouts.py::test_a_request_past_its_queue_timeout_and_its"
            "_deadline_ends_once",),
           "a request past its queue timeout and deadline at once fails the step"),
    Mutant("preempted-times-out-in-queue", "engine/lanes/queue_timeouts.py",
           "return req.first_scheduled_time is not None or req.is_finished",
           'return req.status.name == "RUNNING" or req.is_finished',
           (ENG + "test_queue_timeouts.py::test_a_preempted_request_queued_again_is_past_its"
            "_queue_timeout",),
           "a request that streamed tokens, then was preempted, ends with a queue timeout"),
    Mutant("queue-timeout-at-the-limit", "engine/lanes/queue_timeouts.py",
           "elif now - req.arrival_time > timeout_s:", "elif now - req.arrival_time >= timeout_s:",
           (ENG + "test_queue_timeouts.py::test_a_request_times_out_after_waiting_more_than_the"
            "_timeout_not_at_it",),
           "a request times out at exactly its queue timeout, not after it"),
    Mutant("tenant-join-raises-the-floor", "engine/lanes/tenants.py",
           "self._floor = vtime if floor is None else floor", "self._floor = vtime",
           (ENG + "test_tenant_state.py::test_a_newcomer_joins_level_with_the_queued_tenant"
            "_furthest_behind_whoever_joined_first",),
           "a new tenant joins at a leading tenant's virtual time and is served late"),
    Mutant("length-routes-before-tenant", "engine/lanes/routing.py",
           "    for name, lane in live.tenant_lanes:\n        if name == tenant:\n"
           "            return lane\n    if live.long_context_lane and num_prompt_tokens >="
           " live.long_context_threshold:\n        return live.long_context_lane\n",
           "    if live.long_context_lane and num_prompt_tokens >= live.long_context_threshold:\n"
           "        return live.long_context_lane\n    for name, lane in live.tenant_lanes:\n"
           "        if name == tenant:\n            return lane\n",
           (ENG + "test_scenarios_lanes.py::test_a_tenants_lane_comes_before_routing_by_length",),
           "a tenant mapped to a lane has its long prompts sent to the long-context lane"),
    Mutant("lane-removal-ignores-running", "engine/lanes/routing.py",
           "count = sum(1 for r in requests if r.lane == name)",
           'count = sum(1 for r in requests if r.lane == name and r.status.name != "RUNNING")',
           (ENG + "test_scenarios_live_config.py::test_a_lane_with_only_running_requests_is_not"
            "_removed_without_a_target",),
           "removing a lane whose requests all run is accepted, then fails with a KeyError"),
    Mutant("integrity-skips-timeout-tracking", "engine/lanes/integrity.py",
           "if req.first_scheduled_time is None and id(req) not in tracked:", "if False:",
           (ENG + "test_lane_integrity.py::test_check_integrity_names_the_counter_that_drifted",),
           "check_integrity misses a queued request that can never time out"),
    # ---- output -----------------------------------------------------------------------------
    Mutant("final-text-held-back", "engine/output/processor.py",
           "state.detok.take_delta(final=out.finished)", "state.detok.take_delta(final=False)",
           (ENG + "test_output_processor.py::test_the_last_output_hands_out_the_text_held_back"
            "_for_a_stop_string",),
           "with a stop string set, every answer loses its last characters"),
    Mutant("length-over-stop-string", "engine/output/processor.py",
           "out.finish_reason = state.stop_reason or delta.finish_reason",
           "out.finish_reason = delta.finish_reason or state.stop_reason",
           (ENG + "test_output_processor.py::test_a_stop_string_completed_by_the_last_token_is"
            "_the_finish_reason",),
           "a stop string met by the last token reports finish_reason length"),
]
