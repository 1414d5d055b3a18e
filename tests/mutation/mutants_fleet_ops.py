"""The fleet's canary rule and rolling restart (pass of 2026-12-07, late: each had one planted
bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

CANARY = "control/fleet/canary.py"
RESTART = "control/fleet/restart.py"
RULE_T = CTL + "fleet/test_fleet_canary_rule.py"
RESTART_T = CTL + "fleet/test_fleet_restart.py"
ONE_AT_A_TIME_T = RESTART_T + "::test_one_replica_at_a_time_out_of_routing_until_back_new_and" \
    "_converged"
GRACE_T = RESTART_T + "::test_requests_left_after_the_grace_are_aborted_by_the_replica_and" \
    "_counted"
NOT_BACK_T = RESTART_T + "::test_a_replica_that_does_not_come_back_stops_the_restart"
REFUSALS_T = RESTART_T + "::test_one_at_a_time_and_not_with_a_canary_and_admin_only"
CONVERGED_T = RESTART_T + "::test_a_restarted_replica_is_routed_to_only_once_it_runs_the" \
    "_fleets_config"
SCALING_T = CTL + "fleet/test_fleet_scaling_local.py::test_a_burst_starts_a_replica_and_an" \
    "_idle_spell_drains_then_stops_it"

FLEET_OPS_MUTANTS: list[Mutant] = [
    # the canary's decision rule
    Mutant("canary-ttft-against-itself", CANARY,
           '_latency("ttft_p99_s", canary.ttft_p99_s, baseline.ttft_p99_s,',
           '_latency("ttft_p99_s", canary.ttft_p99_s, canary.ttft_p99_s,', (RULE_T,),
           "a canary 10x slower to its first token is judged against itself and promoted"),
    Mutant("canary-latency-ratio-or-floor", CANARY,
           "limit = max(b * (1 + rel), b + floor)", "limit = min(b * (1 + rel), b + floor)",
           (RULE_T,), "a 2 ms -> 4 ms TTFT on a fast model rolls a harmless change back"),
    Mutant("canary-tpot-on-ttft-thresholds", CANARY,
           "rule.tpot_rel,\n                    rule.tpot_floor_s)",
           "rule.ttft_rel,\n                    rule.ttft_floor_s)", (RULE_T,),
           "a canary 5x slower per output token passes under TTFT's 50 ms floor"),
    Mutant("canary-min-requests-one-side", CANARY,
           "enough = min(canary.requests, baseline.requests) >= rule.min_requests",
           "enough = max(canary.requests, baseline.requests) >= rule.min_requests", (RULE_T,),
           "a canary that served 3 requests is judged (and promoted or rolled back) on them"),
    Mutant("canary-regression-only-at-window-end", CANARY,
           "    if enough:\n        bad = [c.metric", "    if enough and window_over:\n"
           "        bad = [c.metric", (RULE_T,),
           "a canary failing every request keeps serving until its window ends"),
    Mutant("canary-extension-off-by-one", CANARY, "if extensions < rule.max_extensions:",
           "if extensions <= rule.max_extensions:", (RULE_T,),
           "a canary without traffic extends its window once more than --max-extensions"),
    Mutant("canary-inconclusive-promoted", CANARY,
           'return Verdict("rollback", f"inconclusive',
           'return Verdict("promote", f"inconclusive', (RULE_T,),
           "a change nobody sent traffic to is pushed to the whole fleet"),
    Mutant("canary-cancelled-counted", CANARY,
           "requests = sum(outcomes.values()) - cancelled", "requests = sum(outcomes.values())",
           (RULE_T,), "clients that hang up count as requests: the rates are diluted"),
    Mutant("canary-goodput-unchecked", CANARY,
           "cg is not None and limit is not None and cg < limit", "False",
           (RULE_T + "::test_a_regression_rolls_back_at_once_even_mid_window",),
           "a canary that misses its SLO on half the requests (no errors) is promoted"),
    Mutant("canary-rejected-not-an-error", CANARY,
           'errors = outcomes.get("error", 0) + outcomes.get("rejected", 0)',
           'errors = outcomes.get("error", 0)',
           (RULE_T + "::test_a_regression_rolls_back_at_once_even_mid_window",),
           "a canary that rejects requests at arrival (queue full) is promoted"),
    Mutant("canary-error-points-as-ratio", CANARY,
           "limit = None if be is None else be + rule.error_points",
           "limit = None if be is None else be * (1 + rule.error_points)",
           (RULE_T + "::test_one_error_in_200_against_a_clean_baseline_is_within_the_points",),
           "one error in 200 requests against a clean baseline rolls a good change back"),
    Mutant("canary-tpot-p50-for-p99", CANARY, "tpot_p99_s=_pct(tpot, 99)",
           "tpot_p99_s=_pct(tpot, 50)",
           (RULE_T + "::test_a_tpot_regression_in_the_tail_alone_rolls_back",),
           "a canary whose slowest 5% of streams stall is promoted: only the median is seen"),
    Mutant("canary-min-requests-zero-allowed", CANARY, "if self.min_requests < 1:",
           "if self.min_requests < 0:",
           (RULE_T + "::test_a_rule_with_min_requests_zero_is_refused",),
           "--min-requests 0 is taken: a canary that served nothing is promoted"),
    # the rolling restart
    Mutant("restart-all-at-once", RESTART,
           "            for step in self.steps:\n                await self.restart_one(step)",
           "            await asyncio.gather(*(self.restart_one(s) for s in self.steps))",
           (ONE_AT_A_TIME_T,), "every replica is restarted at once: the fleet serves nothing"),
    Mutant("restart-not-out-of-routing", RESTART, "        table.exclude(i)\n", "",
           (ONE_AT_A_TIME_T,),
           "a replica being drained still gets new requests, which its retire then cuts"),
    Mutant("restart-drain-skipped", RESTART,
           "while view.inflight > 0 and time.monotonic() < deadline:", "while False:",
           (ONE_AT_A_TIME_T,), "requests in flight are cut at once, not given their grace"),
    Mutant("restart-drain-grace-ignored", RESTART,
           "while view.inflight > 0 and time.monotonic() < deadline:",
           "while view.inflight > 0:", (GRACE_T,),
           "one stuck request holds the whole restart forever"),
    Mutant("restart-retire-full-grace", RESTART, ".retire.remote(left)",
           ".retire.remote(self.grace_s)", (GRACE_T,),
           "a replica waits out its grace a second time after the drain: twice the downtime"),
    Mutant("restart-old-process-taken-back", RESTART,
           'not in (None, step["old"]["incarnation"])', "not in (None,)",
           (ONE_AT_A_TIME_T,),
           "the old process, still polled ready, counts as back: the next replica goes down"
           " while this one is still restarting"),
    Mutant("restart-not-converged", RESTART,
           "await self._until(lambda: self._converged(i),", "await self._until(lambda: True,",
           (CONVERGED_T,),
           "a restarted replica is routed to on the YAML's config, not the fleet's"),
    Mutant("restart-goes-on-past-a-dead-replica", RESTART,
           "            for step in self.steps:\n                await self.restart_one(step)",
           "            for step in self.steps:\n                try:\n"
           "                    await self.restart_one(step)\n"
           "                except RestartFailed:\n                    continue",
           (NOT_BACK_T,),
           "a replica that never comes back does not stop the restart: it takes the next down"),
    Mutant("restart-dead-replica-left-out", RESTART,
           '                self.fleet.table.include(step["replica_id"])  # once',
           "                pass  # once", (NOT_BACK_T,),
           "a replica that failed to come back in time is never routed to again"),
    Mutant("restart-during-canary", RESTART, "if run_ is not None and run_.running:",
           "if False:", (REFUSALS_T,),
           "a rolling restart takes a canary's replicas out from under its judgement"),
    Mutant("restart-twice-at-once", RESTART, "        fleet.refuse_during_restart()\n", "",
           (REFUSALS_T,), "a second restart starts beside the first: two replicas down"),
    Mutant("restart-during-scale-event", RESTART, "        fleet.refuse_during_scaling()\n",
           "", (SCALING_T,), "a rolling restart starts while autoscaling brings a replica up"),
    Mutant("restart-phase-restarting-as-draining", RESTART, 'self.say(step, "restarting"',
           'self.say(step, "draining"', (ONE_AT_A_TIME_T,),
           "`fleet restart` shows a replica draining while it is in fact down, restarting"),
    Mutant("restart-duplicate-replicas", RESTART,
           "if not replicas or len(set(replicas)) != len(replicas) or \\\n",
           "if not replicas or \\\n", (REFUSALS_T,),
           "--replicas 0,0 restarts replica 0 twice"),
    Mutant("restart-scaled-in-replica", RESTART,
           "off = [i for i in replicas if i not in live]", "off = []", (SCALING_T,),
           "a restart names a slot autoscaling keeps off: Serve starts it, then it times out"),
]
