"""The engine's step, the scheduler, fair share and deadlines (pass of 2026-12-07); each has
a test that fails on it."""

from __future__ import annotations

from mutant_spec import ENG, Mutant

ENGINE_CORE_MUTANTS: list[Mutant] = [
    Mutant("startup-garbage-frozen", "engine/gc_heap.py",
           "    gc.collect()\n    gc.freeze()", "    gc.freeze()",
           ("tests/llm/test_gc_heap.py::"
            "test_a_server_collects_start_ups_garbage_before_freezing_the_rest",),
           "start-up's garbage cycles are frozen for the life of the server: memory never freed"),
    Mutant("engine-duplicate-id-accepted", "engine/engine.py",
           "        if request_id in self.requests:\n            raise",
           "        if False:\n            raise",
           (ENG + "test_scenarios_admission.py::"
            "test_a_request_id_in_use_is_refused_and_the_first_request_goes_on",),
           "a second request with an id in use replaces the first: its stream is lost"),
    Mutant("refusal-ends-running-namesake", "engine/engine.py",
           "if self.requests.get(req.request_id) is req:", "if req.request_id in self.requests:",
           (ENG + "test_scenarios_admission.py::"
            "test_refusing_a_request_whose_id_a_running_one_uses_leaves_that_one_running",),
           "refusing a request cancels a running one that uses the same id"),
    Mutant("lone-refusal-unreported", "engine/engine.py",
           "return bool(self.requests or self._pending_deltas or self._pending_finished)",
           "return bool(self.requests or self._pending_deltas)",
           (ENG + "test_scenarios_admission.py::"
            "test_run_until_done_reports_a_refusal_that_is_all_there_is",),
           "an offline run of only refused requests returns no record of them"),
    Mutant("failed-step-throughput", "engine/engine.py",
           "        if failure is None:  # a failed step's time says nothing of the throughput",
           "        if True:  # a failed step's time says nothing of the throughput",
           (ENG + "test_step_faults.py::"
            "test_a_failed_steps_time_leaves_the_measured_throughput_alone",),
           "a failed step's retries skew the tokens/s that deadline admission reads"),
    Mutant("throughput-decodes-only", "engine/engine.py",
           "self.throughput.observe(out.num_tokens, end - start)",
           "self.throughput.observe(len(out.decodes), end - start)",
           (ENG + "test_deadlines.py::test_the_measured_throughput_counts_prompt_tokens",),
           "the measured tokens/s leaves out prompt tokens: deadlines refused or admitted wrongly"),
    Mutant("deadline-due-at-its-instant", "engine/scheduling/deadlines.py",
           "        while heap and heap[0][0] < now:", "        while heap and heap[0][0] <= now:",
           (ENG + "test_deadlines.py::test_a_deadline_passes_only_after_its_instant",),
           "a started request is timed out at its deadline instant, unlike a queued one"),
    Mutant("stats-queue-share-best-lane", "engine/engine.py",
           '"queue_slo_share": max((q.queue_slo_share',
           '"queue_slo_share": min((q.queue_slo_share',
           (ENG + "test_engine_reports.py::test_stats_queue_slo_share_is_the_worst_lanes",),
           "an idle lane hides a lane whose queue used its TTFT: the autoscaler never scales"),
    Mutant("gauges-wait-reasons-stale", "engine/engine.py",
           "        self._last_wait_reasons = decisions.waiting_reason_by_lane\n",
           "        pass\n",
           (ENG + "test_engine_reports.py::"
            "test_gauges_count_waiting_requests_under_the_reason_the_last_step_gave",),
           "the waiting gauges say not_yet_scheduled whatever held the queue back"),
    Mutant("stats-waiting-counts-running", "engine/engine.py",
           '"waiting": lanes.num_waiting,', '"waiting": len(self.scheduler.running),',
           (ENG + "test_engine_reports.py::test_stats_count_the_running_and_the_queued_apart",),
           "health and the fleet's router read the running count as the queue"),
    Mutant("admitted-time-unset", "engine/engine.py",
           "        req.admitted_time = now\n", "",
           (ENG + "test_engine_reports.py::test_a_record_carries_when_its_request_was_admitted",),
           "a request's record and trace row have no admission time"),
    Mutant("late-chunks-uncharged", "engine/scheduling/scheduler.py",
           "                charges.add(self.lanes[req.lane], req.tenant, num_new)",
           "                pass",
           (ENG + "test_slo_deferral.py::"
            "test_a_deferred_prompts_chunks_count_in_its_lanes_tokens",),
           "a deferred prompt's chunks are free to its lane's fair share and token counters"),
    Mutant("deferred-wait-from-admission", "engine/scheduling/scheduler.py",
           "now - req.arrival_time < self.lanes[req.lane].queue_timeout_s(",
           "now - req.admitted_time < self.lanes[req.lane].queue_timeout_s(",
           (ENG + "test_slo_deferral.py::"
            "test_a_deferred_prompt_that_arrived_a_queue_timeout_ago_runs_in_its_place",),
           "a deferred prompt that waited its queue timeout since arrival still yields the step"),
    Mutant("late-chunk-of-a-victim", "engine/scheduling/scheduler.py",
           "if req.status is RequestStatus.RUNNING and (  # else preempted as a victim",
           "if (  # else preempted as a victim",
           (ENG + "test_slo_deferral.py::"
            "test_a_deferred_prompt_preempted_in_a_step_runs_nothing_in_it",),
           "a deferred prompt preempted in a step runs a chunk and holds KV while queued"),
    Mutant("partial-decode-tenants-free", "engine/scheduling/fair_share.py",
           "                by_tenant.setdefault(name, {})[tenant] = num",
           "                pass",
           (ENG + "test_tenant_state.py::"
            "test_tenants_are_charged_the_decodes_of_a_step_too_small_for_all_of_them",),
           "when not every decode fits a step, tenants' decodes are free to the fair share"),
    Mutant("unadopted-refit-recorded", "engine/engine.py",
           "        if refit is not None and refit.adopted:", "        if refit is not None:",
           (ENG + "test_online_law.py::"
            "test_a_refit_not_adopted_leaves_no_law_change_in_the_step_records",),
           "the audit log shows step-law changes that never took effect"),
]
