"""Mutants for the engine's lanes' queues, the scheduler's state and token budget, fault isolation,
the detokenizer, the structured-output compile slots and the engine's records (pass of
2026-12-08: each module had at most two planted bugs), and for the CPU thread governor
added that day; each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import ENG, SEC, Mutant

QU = "engine/lanes/queues.py"
ST = "engine/scheduling/state.py"
BU = "engine/scheduling/budget.py"
FI = "engine/fault_isolation.py"
DT = "engine/output/detokenizer.py"
CS = "engine/structured/compile_slots.py"
RC = "engine/records.py"
TG = "engine/calibration/thread_governor.py"
GOV_T = ENG + "test_thread_governor.py::"
UNDONE_T = GOV_T + "test_a_trial_that_does_not_win_by_the_margin_is_undone_and_the_next_waits"

LANES_T = ENG + "test_scenarios_lanes.py"
POLICIES_T = LANES_T + "::test_queue_policies_order_requests"
MAX_RUNNING_T = LANES_T + "::test_lane_max_running_caps_that_lane_only"
LATE_LANE_T = LANES_T + "::test_lane_joining_late_gets_no_credit_from_a_decode_only_lane"
SCEN_T = ENG + "test_scenarios.py"
RESUME_T = SCEN_T + "::test_preempted_request_resumes_with_the_same_tokens"
CANCEL_T = SCEN_T + "::test_cancel_frees_blocks_before_next_step"
WHOLE_PROMPT_T = SCEN_T + "::test_chunked_prefill_off_runs_each_prompt_whole"
PREFIX_T = SCEN_T + "::test_prefix_cache_hits_on_shared_system_prompt"
SHORT_T = SCEN_T + "::test_short_request_not_stuck_behind_long_prompt"
TIMEOUT_T = ENG + "test_scenarios_admission.py::test_waiting_request_past_queue_timeout_times_out"
LIVE_T = ENG + "test_scenarios_live_config.py"
CANCELLED_LANE_T = LIVE_T + "::test_a_cancelled_request_does_not_hold_its_lane"
FEWER_SEQS_T = LIVE_T + "::test_lowering_max_num_seqs_under_load_lets_every_running_request" \
    "_advance"
SHORTEST_T = ENG + "test_slo_deferral.py::test_deferred_requests_start_after_the_others_and" \
    "_the_shortest_first"
INVARIANTS_T = ENG + "test_scheduler_invariants.py"
OVER_BUDGET_T = INVARIANTS_T + "::test_a_step_over_its_budget_is_an_error_naming_the_numbers"
TWICE_T = INVARIANTS_T + "::test_ending_a_request_twice_is_an_error"
STEP_TIME_T = ENG + "test_step_time.py"
ADVANCES_T = STEP_TIME_T + "::test_a_started_prompt_always_advances_even_with_no_time_left"
FAULTS_T = ENG + "test_step_faults.py"
FAILING_PREFILL_T = FAULTS_T + "::test_a_failing_prefill_ends_only_its_request"
LOST_DEVICE_T = FAULTS_T + "::test_a_lost_device_ends_the_batch_and_spares_the_queued_and_the" \
    "_preempted"
BISECT_T = FAULTS_T + "::test_bisection_stays_within_its_budget"
SPLIT_T = FAULTS_T + "::test_split_keeps_batch_order_and_token_counts"
DETOK_T = "tests/llm/test_detokenizer.py"
DELTAS_T = DETOK_T + "::test_streamed_deltas_add_up_to_the_text"
HELD_T = DETOK_T + "::test_stop_string_held_back_then_cut"
INSIDE_CHAR_T = DETOK_T + "::test_an_output_ending_inside_a_character_still_shows_its_bytes"
LAST_OUTPUT_T = ENG + "test_output_processor.py::test_the_last_output_hands_out_the_text_held" \
    "_back_for_a_stop_string"
SLOTS_T = SEC + "test_structured_limits.py::test_compile_slots_bound_join_and_free"
BS_EDGES_T = ENG + "test_budget_state_edges.py"
ONCE_T = BS_EDGES_T + "::test_a_preempted_request_counts_its_preemption_and_is_admitted_once"
RC_EDGES_T = ENG + "test_records_edges.py"
REPORTS_T = ENG + "test_engine_reports.py"
TPOT_T = REPORTS_T + "::test_tpot_is_the_mean_gap_between_output_tokens"

ENGINE_PARTS_MUTANTS: list[Mutant] = [
    # ---- engine/calibration/thread_governor.py ---------------------------------------
    Mutant("threads-trial-kept-when-worse", TG, "if after < KEEP * before:",
           "if after < before / KEEP:", (UNDONE_T,),
           "a trial of one thread barely better, or worse, than all threads is kept: a"
           " quiet server drops to one thread"),
    Mutant("threads-suspect-when-quiet", TG,
           "and statistics.median(self._recent) <= SUSPECT):",
           "and statistics.median(self._recent) < 0):",
           (GOV_T + "test_a_quiet_machine_runs_only_the_probes_and_undoes_them",),
           "a quiet server runs a trial of one thread every step it may"),
    Mutant("threads-no-probe", TG, "        probe = now >= self._next_probe\n",
           "        probe = False\n",
           (GOV_T + "test_a_server_that_started_beside_the_other_process_finds_one_thread"
            "_by_its_probe",),
           "a server that started beside a busy process never tries one thread"),
    Mutant("threads-no-backoff", TG,
           "        self._backoff_s = min(2 * self._backoff_s, MAX_BACKOFF_S)\n", "",
           (GOV_T + "test_another_process_on_the_cores_sends_the_steps_to_one_thread_and"
            "_back",),
           "while the neighbour stays, a trial of all threads every 30 s costs several"
           " slow steps each time"),
    Mutant("threads-failed-trial-not-undone", TG, "        self._set(self.threads)\n", "",
           (UNDONE_T,), "a trial that lost leaves the steps on its thread count"),
    Mutant("threads-none-counted", TG,
           "        if relative is None:\n            return None\n", "",
           (GOV_T + "test_steps_without_a_relative_cost_do_not_count",),
           "steps without a relative cost break the governor (a TypeError in its median)"),
    Mutant("failed-step-ends-by-phase", FI,
           "    ended.sort(key=lambda req: position[id(req)])\n", "",
           (ENG + "test_fault_isolation_edges.py::test_a_part_whose_tokens_cannot_be_applied"
            "_ends_only_its_requests",),
           "a failed step's error deltas and StepFailure list the parts that failed in"
           " execute first, not the batch's order their docstrings promise"),
    # ---- a lane's queue (engine/lanes/queues.py) ----------------------------------------
    Mutant("priority-lane-largest-first", QU,
           "key: tuple = (req.priority,)", "key: tuple = (-req.priority,)",
           (POLICIES_T,), "a priority lane starts its least urgent request first"),
    Mutant("fcfs-latest-first", QU,
           "return (False, *key, req.arrival_time, req.queue_seq)",
           "return (False, *key, -req.arrival_time, req.queue_seq)",
           (POLICIES_T,), "a fcfs lane serves the latest arrival first: early clients starve"),
    Mutant("deferred-by-arrival-not-length", QU,
           "return (True, *key, req.num_prompt_tokens, req.arrival_time, req.queue_seq)",
           "return (True, *key, req.arrival_time, req.num_prompt_tokens, req.queue_seq)",
           (SHORTEST_T,),
           "deferred requests start oldest first, not shortest first: fewer of them finish"
           " before their queue timeout"),
    Mutant("lane-joins-ahead-of-the-queued", QU,
           "floor = min(queued) if queued", "floor = max(queued) if queued",
           (ENG + "test_lane_queue_edges.py::test_a_lane_that_starts_queueing_joins_level_with"
            "_the_one_furthest_behind",),
           "a lane that starts queueing joins level with the lane furthest ahead: it waits"
           " behind the others' whole backlog"),
    Mutant("lane-keeps-its-credit", QU,
           "return max(own, floor)", "return own",
           (LATE_LANE_T,),
           "a lane idle for a while comes back with credit and takes every token from the"
           " lanes that kept queueing"),
    Mutant("cancelled-queued-still-waiting", QU,
           "self.num_waiting -= 1\n        self.num_deferred",
           "self.num_waiting -= not finished\n        self.num_deferred",
           (CANCELLED_LANE_T, TIMEOUT_T),
           "a request cancelled while queued stays counted: queue-full refusals and waiting"
           " gauges count ghosts"),
    Mutant("waiting-tokens-less-prefix-hits", QU,
           "self.waiting_tokens -= req.num_tokens\n",
           "self.waiting_tokens -= req.num_tokens - req.num_computed_tokens\n",
           (PREFIX_T,),
           "a start with a prefix hit leaves its hit tokens in the lane's waiting tokens:"
           " admission's wait estimates grow until requests are refused"),
    Mutant("blocked-lane-picked", QU,
           "if lane.num_waiting == 0 or lane.name in blocked:", "if lane.num_waiting == 0:",
           (MAX_RUNNING_T,), "a lane at its max_running starts more requests"),
    Mutant("waiting-reason-counts-lanes", QU,
           "counts[reason] = counts.get(reason, 0) + lane.num_waiting",
           "counts[reason] = counts.get(reason, 0) + 1",
           (MAX_RUNNING_T,),
           "the waiting-by-reason gauges count lanes, not queued requests: an operator sees"
           " one waiting where there are hundreds"),
    Mutant("policy-change-keeps-old-order", QU,
           "if old.policy != config.policy or old.tenant_fair_share != config.tenant_fair_share:",
           "if old.tenant_fair_share != config.tenant_fair_share:",
           (ENG + "test_lane_queue_edges.py::test_a_live_change_of_policy_reorders_the_queued"
            "_requests",),
           "a live change of a lane's policy orders the queued requests by the old policy"),
    # ---- the scheduler's state (engine/scheduling/state.py) ----------------------------
    Mutant("preempt-keeps-computed-tokens", ST,
           "req.num_computed_tokens = 0", "pass",
           (BS_EDGES_T + "::test_a_preempted_request_recomputes_its_whole_context_when_blocks"
            "_are_free_at_once",),
           "a preempted request resumes as if its dropped KV were still there: wrong tokens"),
    Mutant("preemption-not-counted", ST,
           "req.num_preemptions += 1", "pass",
           (ONCE_T,),
           "records say a request was never preempted: an operator cannot see the thrash"),
    Mutant("preempted-request-dropped", ST,
           "        self.lanes.push(req)\n        decisions.preempted",
           "        decisions.preempted",
           (RESUME_T,), "a preempted request is never queued again: its client hangs"),
    Mutant("resume-counted-as-admission", ST,
           "if req.first_scheduled_time is None:", "if True:",
           (ONCE_T,),
           "a resumed request is admitted again: its queue delay restarts and the step"
           " records count it twice"),
    Mutant("finished-running-stays-in-lane", ST,
           "            self.running.remove(req)\n            self.lanes[req.lane].remove_running"
           "(req)\n        elif",
           "            self.running.remove(req)\n        elif",
           (CANCEL_T,),
           "a finished request keeps its lane's running slot: a lane with max_running stalls"),
    Mutant("chunked-prefill-off-still-chunks", ST,
           "return live.prefill_chunk_size if live.chunked_prefill else self.static.max_model_len",
           "return live.prefill_chunk_size",
           (WHOLE_PROMPT_T,), "chunked_prefill: false still splits long prompts"),
    Mutant("finish-twice-allowed", ST,
           "if not status.is_finished or req.is_finished:", "if not status.is_finished:",
           (TWICE_T,),
           "a request ended twice is not caught: its blocks are freed twice, another"
           " request's KV is overwritten"),
    Mutant("deferred-work-never-reset", ST,
           "        self._deferred_work = 0.0\n        self._deferred_waited = any",
           "        self._deferred_waited = any",
           (BS_EDGES_T + "::test_a_deferred_start_counts_once_in_the_device_time_deferred"
            "_requests_get",),
           "deferred requests' device time counts every step again: the spare rate looks"
           " healthy and admission takes requests that will time out"),
    # ---- one step's budget (engine/scheduling/budget.py) ------------------------------
    Mutant("room-ignores-sequences", BU,
           "return min(self.tokens_left, self.seqs_left)", "return self.tokens_left",
           (FEWER_SEQS_T,),
           "with max_num_seqs lowered, the running set is not served in turn: some streams"
           " stall"),
    Mutant("budget-check-one-over", BU,
           "if (num_tokens > self.max_tokens or", "if (num_tokens > self.max_tokens + 1 or",
           (OVER_BUDGET_T,),
           "a step one token over max_num_batched_tokens passes the check: a step over the"
           " kernels' limits goes to the device"),
    Mutant("decodes-over-charged", BU,
           "self.budget.take(num_decodes, num_decodes)",
           "self.budget.take(num_decodes + 1, num_decodes)",
           (SHORT_T,), "decodes take one token more than they run: the step's budget check"
           " fails and every step errors"),
    Mutant("victim-sequence-kept", BU,
           "            budget.give_back(1)\n", "            budget.give_back(1, 0)\n",
           (STEP_TIME_T + "::test_a_preemption_victim_takes_its_decode_out_of_the_steps"
            "_prediction",),
           "a preempted decode's sequence is not given back: the budget check fails the step"),
    Mutant("victim-chunks-kept", BU,
           "out.prefills = [c for c in out.prefills if c.request is not victim]",
           "out.prefills = list(out.prefills)",
           (BS_EDGES_T + "::test_a_victim_preempted_after_its_chunk_was_given_runs_nothing_in"
            "_that_step",),
           "a preemption victim's prompt chunk still runs, on KV blocks it no longer holds"),
    Mutant("resumed-prefill-not-sampled", BU,
           "sample = req.num_computed_tokens + num_tokens == req.num_tokens",
           "sample = req.num_computed_tokens + num_tokens == req.num_prompt_tokens",
           (RESUME_T,),
           "a resumed request's recompute never samples: it stalls or repeats its tokens"),
    Mutant("grown-chunk-ignored", BU,
           "live.prefill_chunk_size if chunk is None else chunk, time)",
           "live.prefill_chunk_size, time)",
           (ENG + "test_goodput_policy.py::test_a_burst_meets_more_slos_with_grown_steps_than"
            "_held_to_the_target",),
           "a step grown to clear a queue still runs base-sized chunks: the queue misses its"
           " TTFT targets"),
    Mutant("first-chunk-not-guaranteed", BU,
           "self.time.chunk_room(req.num_computed_tokens, not self.out.prefills)",
           "self.time.chunk_room(req.num_computed_tokens, False)",
           (ADVANCES_T,),
           "a long prompt whose next chunk costs more than a step's time never advances"),
    # ---- a failed step (engine/fault_isolation.py) -------------------------------------
    Mutant("split-drops-a-prefill", FI,
           "rest_d, rest_p = decodes[half:], prefills[len(first_p):]",
           "rest_d, rest_p = decodes[half:], prefills[len(first_p) + 1:]",
           (SPLIT_T,),
           "bisection loses a prompt chunk: that request is neither run nor ended and hangs"),
    Mutant("part-counts-chunks-not-tokens", FI,
           "num_prefill_tokens=sum(c.num_tokens for c in prefills))",
           "num_prefill_tokens=len(prefills))",
           (SPLIT_T,),
           "a retried part reports one token per prompt chunk: its step's tokens and"
           " throughput are wrong"),
    Mutant("bisection-one-run-over", FI,
           "if part.num_seqs > 1 and runs_left >= 2:", "if part.num_seqs > 1 and runs_left >= 1:",
           (ENG + "test_fault_isolation_edges.py::test_an_odd_budget_of_extra_runs_is_never"
            "_exceeded",),
           "a lost device costs one executor call more than fault_isolation_runs allows"),
    Mutant("bisection-charged-one-a-split", FI,
           "runs_left -= 2", "runs_left -= 1",
           (BISECT_T,),
           "a failing step is retried twice as often as allowed: a lost device stalls every"
           " stream longer"),
    Mutant("single-request-split-again", FI,
           "if part.num_seqs > 1 and", "if part.num_seqs > 0 and",
           (LOST_DEVICE_T,),
           "a failing single request is re-run through empty parts: extra device calls on"
           " every fault"),
    Mutant("failed-part-ends-whole-step", FI,
           "ended += sched.end_with_error(part_requests(part), now,",
           "ended += sched.end_with_error(part_requests(out), now,",
           (FAILING_PREFILL_T,),
           "one bad request's fault ends the other requests of its step"),
    Mutant("part-update-failure-ignored", FI,
           "failed.append((part, \"update\", exc))", "pass",
           (ENG + "test_fault_isolation_edges.py::test_a_part_whose_tokens_cannot_be_applied"
            "_ends_only_its_requests",),
           "a part whose tokens cannot be applied is forgotten: its requests neither advance"
           " nor end"),
    Mutant("second-half-first", FI,
           "pending += [(second, None), (first, None)]",
           "pending += [(first, None), (second, None)]",
           (FAILING_PREFILL_T,),
           "after a failed step the parts are applied out of batch order: rows and deltas"
           " come back shuffled"),
    Mutant("transient-fault-reported-as-update", FI,
           "failed[0] if failed else (out, phase, error)",
           "failed[0] if failed else (out, \"update\", error)",
           (ENG + "test_fault_isolation_edges.py::test_a_transient_fault_is_reported_in_the"
            "_phase_that_raised",),
           "a transient executor fault is logged as an update failure: an operator looks for"
           " a scheduler bug"),
    # ---- text out (engine/output/detokenizer.py) ---------------------------------------
    Mutant("partial-utf8-emitted", DT,
           "if len(after) > len(before) and not after.endswith(\"\\ufffd\"):",
           "if len(after) > len(before):",
           (DELTAS_T,), "a stream shows U+FFFD where a multi-byte character is split"),
    Mutant("holdback-one-short", DT,
           "end = max(self.emitted, end - (max(len(s) for s in self.stop) - 1))",
           "end = max(self.emitted, end - (max(len(s) for s in self.stop) - 2))",
           (ENG + "test_detokenizer_edges.py::test_no_start_of_a_stop_string_is_streamed",),
           "the first character of a stop string is streamed before the stop is seen"),
    Mutant("final-delta-holds-back", DT,
           "if not final and self.stop and self.stopped_on is None:",
           "if self.stop and self.stopped_on is None:",
           (LAST_OUTPUT_T,),
           "the text held back for a possible stop string is never sent: replies lose their"
           " last characters"),
    Mutant("stop-by-list-order", DT,
           "pos, s = min(hits)", "pos, s = hits[0]",
           (ENG + "test_detokenizer_edges.py::test_the_earliest_stop_string_in_the_text_wins",),
           "with several stop strings, text runs past the earliest to the first one listed"),
    Mutant("stop-string-kept", DT,
           "self.text = self.text[:pos]", "self.text = self.text[:pos + len(s)]",
           (HELD_T,), "the stop string itself is sent to the client"),
    Mutant("incomplete-tail-dropped", DT,
           "if self.stopped_on is not None or self._read == len(self._ids):", "if True:",
           (INSIDE_CHAR_T,),
           "an output cut inside a multi-byte character loses those tokens' text"),
    Mutant("text-after-stop", DT,
           "            if self.stopped_on is not None:\n                return",
           "            if False:\n                return",
           (ENG + "test_detokenizer_edges.py::test_tokens_after_a_stop_add_no_text",),
           "tokens sampled after a stop string (the rest of a step) add text past the stop"),
    Mutant("special-tokens-always-skipped", DT,
           "return self._backend(ids, skip_special_tokens=self.skip_special_tokens)",
           "return self._backend(ids, skip_special_tokens=True)",
           (ENG + "test_detokenizer_edges.py::test_skip_special_tokens_false_shows_them",),
           "skip_special_tokens: false is ignored: a client asking for special tokens never"
           " sees them"),
    # ---- grammar compile slots (engine/structured/compile_slots.py) --------------------
    Mutant("compile-not-joined", CS,
           "if job is not None:", "if False:",
           (SLOTS_T,),
           "requests sending one schema each start a compile: one runaway schema takes every"
           " slot"),
    Mutant("compile-slot-one-over", CS,
           "if len(self._running) >= self.capacity:", "if len(self._running) > self.capacity:",
           (SLOTS_T,), "one compile more than the capacity runs at once"),
    Mutant("compile-slot-never-freed", CS,
           "del self._running[key]", "self._running.get(key)",
           (SLOTS_T,),
           "a finished compile keeps its slot: after `capacity` schemas every structured"
           " request is a 429"),
    Mutant("compile-slot-freed-at-timeout", CS,
           "                job.abandoned = True\n",
           "                job.abandoned = True\n"
           "                self._running = {k: j for k, j in self._running.items()"
           " if j is not job}\n",
           (SLOTS_T,),
           "a slot is reused while its runaway compile still runs: runaways pile up without"
           " bound"),
    Mutant("abandoned-twice", CS,
           "if job is not None and not job.abandoned:", "if job is not None:",
           (SLOTS_T,),
           "one compile two callers gave up on counts as two: the abandoned gauge overstates"),
    Mutant("abandoned-running-never-falls", CS,
           "if job.abandoned:\n                    self.counts.abandoned_running -= 1",
           "if False:\n                    self.counts.abandoned_running -= 1",
           (SLOTS_T,),
           "runaway compiles that ended still show as running: an operator hunts ghosts"),
    Mutant("join-not-counted", CS,
           "self.counts.joined += 1", "pass",
           (SLOTS_T,), "compiles joined are not counted: the metric shows no sharing"),
    Mutant("compile-error-swallowed", CS,
           "outcome: tuple[str, Any] = (\"exception\", exc)",
           "outcome: tuple[str, Any] = (\"result\", None)",
           (SLOTS_T,),
           "a schema that fails to compile yields no grammar: the request runs unconstrained"),
    # ---- records (engine/records.py) ---------------------------------------------------
    Mutant("record-ttft-from-scheduling", RC,
           "ttft_s=req.ttft_s", "ttft_s=req.prefill_time_s",
           (RC_EDGES_T + "::test_a_record_derives_its_latencies_from_its_own_times",),
           "TTFT leaves out the queue wait: SLOs judged met while clients waited"),
    Mutant("record-first-token-at-scheduling", RC,
           "first_token_time=req.first_token_time", "first_token_time=req.first_scheduled_time",
           (RC_EDGES_T + "::test_a_record_derives_its_latencies_from_its_own_times",),
           "the trace shows the first token when the prompt was only scheduled"),
    Mutant("record-queue-delay-is-prefill", RC,
           "queue_delay_s=req.queue_delay_s", "queue_delay_s=req.prefill_time_s",
           (RC_EDGES_T + "::test_a_record_derives_its_latencies_from_its_own_times",),
           "the queue delay reported is the prefill's time: queueing looks free"),
    Mutant("record-tpot-is-decode-time", RC,
           "tpot_s=req.tpot_s", "tpot_s=req.decode_time_s",
           (TPOT_T,), "TPOT is the whole decode time: every TPOT SLO looks missed"),
    Mutant("length-is-not-finished", RC,
           "if self.finish_reason in (\"stop\", \"length\"):",
           "if self.finish_reason == \"stop\":",
           (RC_EDGES_T + "::test_a_request_that_reached_its_length_finished",),
           "a request that reached max_tokens counts as a failure outcome, not finished"),
    Mutant("every-chunk-sampled", RC,
           "[c.request for c in self.prefills if c.sample]",
           "[c.request for c in self.prefills]",
           (RC_EDGES_T + "::test_the_sample_rows_are_the_decodes_then_the_chunks_that_reach"
            "_their_last_token",),
           "a prompt's middle chunks are sampled: in the what-if replays (the simulated executor"
           " without its shadow KV) every step with a chunked prompt fails"),
    Mutant("failure-detail-leaks-message", RC,
           "return f\"{STEP_FAILED}: {phase} raised {type(error).__name__}\"",
           "return f\"{STEP_FAILED}: {phase} raised {type(error).__name__}: {error}\"",
           (FAILING_PREFILL_T,),
           "an exception's text (internals, other requests' ids) reaches the client"),
    Mutant("ended-deltas-dropped", RC,
           "self._deltas = self.ended + [", "self._deltas = [",
           (TIMEOUT_T,),
           "a request that timed out or was aborted never gets its final delta: its client"
           " hangs"),
    Mutant("step-tokens-prefill-only", RC,
           "return self.num_decode_tokens + self.num_prefill_tokens",
           "return self.num_prefill_tokens",
           (SHORT_T,),
           "a step's tokens leave out its decodes: tokens_used and throughput undercount"),
]
