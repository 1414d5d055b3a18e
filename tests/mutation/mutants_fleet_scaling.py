"""Mutants for the fleet's control plane and scaling rules, the server's start-up and drain
(control/serve/server.py) and the simulated engine's KV model (pass of 2026-12-08: each module
had at most one planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

CP = "control/fleet/control_plane.py"
SC = "control/fleet/scaling.py"
SV = "control/serve/server.py"
SK = "engine/sim/shadow_kv.py"
PLANE_T = CTL + "fleet/test_fleet_control_plane.py"
DOWN_T = PLANE_T + "::test_a_replica_that_is_down_gets_the_change_when_it_is_back"
REFUSAL_T = PLANE_T + "::test_a_replicas_refusal_reaches_the_caller_with_its_param"
CANARY_T = PLANE_T + "::test_a_bad_canary_rolls_back_with_its_evidence_and_blocks_changes" \
    "_meanwhile"
SCALING_T = CTL + "fleet/test_fleet_scaling_local.py"
BURST_T = SCALING_T + "::test_a_burst_starts_a_replica_and_an_idle_spell_drains_then_stops_it"
RETIRING_T = SCALING_T + "::test_a_retiring_replica_with_any_work_left_is_still_called"
SHADOW_T = ENG + "test_shadow_kv.py"
ONE_STEP_T = SHADOW_T + "::test_one_step_reads_back_what_each_sequence_wrote_and_the_digests" \
    "_per_sequence"
PREFIX_T = SHADOW_T + "::test_same_tokens_after_a_different_prefix_do_not_match"
POOL_T = SHADOW_T + "::test_shadow_reports_a_table_too_short_and_a_block_outside_the_pool"

EDGES_T = CTL + "fleet/test_fleet_scaling_edges.py"
NOTHING_T = EDGES_T + "::test_a_dry_run_or_a_change_of_nothing_records_no_version_and_pushes" \
    "_nothing"
DEAD_T = EDGES_T + "::test_a_change_while_a_replica_is_dead_skips_it_and_reaches_it_once_back"
SLOW_T = EDGES_T + "::test_a_slow_replica_converges_and_converge_s_is_the_slowest_install"
RETRY_T = EDGES_T + "::test_a_replica_that_refuses_a_push_is_retried_after_its_delay_and_shown" \
    "_failed"
INSTALLING_T = EDGES_T + "::test_a_replica_still_installing_is_not_pushed_again_meanwhile"
OFF_SLOTS_T = EDGES_T + "::test_slots_autoscaling_keeps_off_get_no_push_and_no_audit_row"
IN_FLIGHT_T = EDGES_T + "::test_a_retiring_slot_is_a_scale_event_under_way"
SIGNALS_T = EDGES_T + "::test_a_down_replica_or_one_a_restart_took_out_is_not_load_the_rules_read"
HOLD_T = EDGES_T + "::test_only_a_running_restart_or_canary_holds_the_autoscaler"
EVENTS_T = EDGES_T + "::test_scale_events_count_only_routed_replicas_and_audit_only_scale_up_and" \
    "_down"
WAITED_T = EDGES_T + "::test_a_phase_read_from_the_board_keeps_how_long_its_want_held"
SERVER_T = CTL + "serve/test_server_edges.py"
BEFORE_T = SERVER_T + "::test_a_signal_before_serving_just_stops"
SIGNALS_TWICE_T = SERVER_T + "::test_one_drain_however_many_sigterms_and_a_second_ctrl_c_forces" \
    "_the_exit"
WITHIN_GRACE_T = SERVER_T + "::test_a_request_finishing_within_the_grace_period_is_not_aborted"
PAST_GRACE_T = SERVER_T + "::test_an_idle_server_drains_at_once_and_one_past_the_grace_is_aborted"
ADDRESS_T = SERVER_T + "::test_the_ready_address_is_the_bound_port_or_the_edges"
LOAD_FAILED_T = SERVER_T + "::test_a_model_that_fails_to_load_exits_one"
DEAD_EDGE_T = SERVER_T + "::test_a_dead_edge_stops_the_server_with_one_unless_it_is_draining"
SOCKET_T = SERVER_T + "::test_a_server_without_its_edge_removes_the_edges_socket"
SK_EDGES_T = ENG + "test_shadow_kv_edges.py"
NEGATIVE_T = SK_EDGES_T + "::test_a_negative_block_id_is_outside_the_pool"
OUTSIDE_T = SK_EDGES_T + "::test_a_block_outside_the_pool_is_reported_at_its_first_position"
SIZE_0_T = SK_EDGES_T + "::test_a_block_size_of_0_is_refused_naming_it"
TOKEN_0_T = SK_EDGES_T + "::test_a_wrong_block_holding_token_0_is_reported_as_that_token"
COUNTERS_T = SK_EDGES_T + "::test_a_prefix_hit_counts_its_context_as_read_and_only_its_new" \
    "_tokens_as_written"

FLEET_SCALING_MUTANTS: list[Mutant] = [
    # ---- the fleet's control plane (control/fleet/control_plane.py) ---------------------
    Mutant("cp-dry-run-applied", CP, "if dry_run or not changes:", "if not changes:",
           (NOTHING_T,), "a dry run (?dry_run=true) records a version and pushes it everywhere"),
    Mutant("cp-empty-change-versioned", CP, "if dry_run or not changes:", "if dry_run:",
           (NOTHING_T,), "a PATCH that changes nothing adds a version and re-pushes every replica"),
    Mutant("cp-check-asks-down-replicas", CP,
           "if v.healthy and (replicas is None", "if (replicas is None", (DEAD_T,),
           "a change is refused (503) while any replica is down: no incident fix goes out"),
    Mutant("cp-check-refusal-ignored", CP, 'if not answer.get("ok"):', "if False:",
           (REFUSAL_T,), "a value a replica refuses is recorded as the fleet's version anyway"),
    Mutant("cp-push-to-down-replica", CP,
           "self.sync_replica(i, actor) if views[i].healthy else _down(i)",
           "self.sync_replica(i, actor)", (DOWN_T,),
           "a change waits on a dead replica's call (up to 30 s) before it answers"),
    Mutant("cp-converge-s-fastest", CP, 'max((r["applied_s"]', 'min((r["applied_s"]',
           (SLOW_T,), "converge_s reports the fastest replica, not the time to converge"),
    Mutant("cp-retry-delay-ignored", CP, " and now >= self._retry_at[i]", "", (RETRY_T,),
           "a replica that refuses a push is pushed again every 0.5 s, flooding it and the log"),
    Mutant("cp-reconcile-while-pushing", CP, "and not self._locks[i].locked() ", "",
           (INSTALLING_T,), "a slow replica gets the same version pushed again and again while it"
           " installs the first"),
    Mutant("cp-reconcile-down-replica", CP,
           "if (view.healthy and version != self.versions.target(i)",
           "if (version != self.versions.target(i)", (DEAD_T,),
           "a replica that is down is called every 0.5 s, each call waiting for its timeout"),
    Mutant("cp-call-timeout-ms", CP, "CALL_TIMEOUT_S = 30.0", "CALL_TIMEOUT_S = 0.030",
           (SLOW_T,), "30 ms read as 30 s the other way round: a replica mid-step counts as"
           " failed and every change reads not converged"),
    Mutant("cp-canary-does-not-block", CP, "if run is not None and run.running:",
           "if run is not None and not run.running:", (CANARY_T,),
           "a change lands while a canary is watching: its verdict judges the wrong config"),
    Mutant("cp-audit-every-slot", CP, "one(self.fleet.handles[i]) for i in self.fleet.live_ids()",
           "one(h) for h in self.fleet.handles", (OFF_SLOTS_T,),
           "an audit row is sent to a slot autoscaling keeps off: Serve starts a replica for it"),
    Mutant("cp-push-every-slot", CP, "await self.push_all(self.fleet.live_ids(), actor)",
           "await self.push_all(range(len(self.fleet.handles)), actor)", (OFF_SLOTS_T,),
           "every change reads not converged on an autoscaled fleet (its off slots are down)"),
    Mutant("cp-failed-push-shown-ok", CP, '"ok": answer.get("ok"),', '"ok": True,', (RETRY_T,),
           "GET /control/config shows a replica's failed push as ok: the operator cannot see"
           " why it lags"),
    # ---- the ingress's half of autoscaling (control/fleet/scaling.py) -------------------
    Mutant("sc-fixed-off-by-one", SC, "slot < self.config.min_replicas",
           "slot <= self.config.min_replicas", (BURST_T,),
           "one slot more than min_replicas is kept on for good: the fleet never shrinks to min"),
    Mutant("sc-retiring-still-routed", SC, 'return self.phases[slot] == "on"',
           'return self.phases[slot] in ("on", "retiring")', (BURST_T,),
           "a draining replica keeps taking new requests: it never goes idle, never stops"),
    Mutant("sc-off-slot-called", SC, 'return phase in ("starting", "on")',
           'return phase != "retiring"', (BURST_T,),
           "an off slot is polled: Serve starts its replica behind the autoscaler's back"),
    Mutant("sc-retiring-not-in-flight", SC, 'if phase in ("starting", "retiring"):',
           'if phase == "starting":', (IN_FLIGHT_T,),
           "a canary or rolling restart starts while a replica drains, counting it as baseline"),
    Mutant("sc-idle-ignores-inflight", SC, "return view.inflight == 0 and not",
           "return not", (RETIRING_T,),
           "a retiring replica is sent to 0 with the ingress's requests still open on it"),
    Mutant("sc-down-replica-queue-counted", SC,
           "p, i = view.polled if view.healthy else {}, view.replica_id",
           "p, i = view.polled, view.replica_id", (SIGNALS_T,),
           "a dead replica's last queue keeps the fleet scaling up for load that is gone"),
    Mutant("sc-excluded-replica-routed", SC, "self.routed(i) and view.routable",
           "self.routed(i)", (SIGNALS_T,),
           "a replica a rolling restart took out still counts as routed: the load per replica"
           " reads low and no replica is added during the restart"),
    Mutant("sc-restart-no-hold", SC, "if restart is not None and restart.running:",
           "if restart is not None and not restart.running:", (HOLD_T,),
           "autoscaling stops a replica in the middle of a rolling restart"),
    Mutant("sc-finished-canary-holds", SC, "if canary is not None and canary.running:",
           "if canary is not None:", (HOLD_T,),
           "after the first canary, autoscaling holds forever: no scale up under any load"),
    Mutant("sc-routed-counts-starting", SC, 'live = sum(p == "on" for p in self.phases)',
           'live = sum(p != "off" for p in self.phases)', (EVENTS_T,),
           "scale events say more replicas are routed than take requests"),
    Mutant("sc-waited-s-dropped", SC, "state.reason,\n                                   "
           "state.waited_s)", "state.reason)", (WAITED_T,),
           "scale events lose how long the load held: the dashboard cannot show the delay"),
    Mutant("sc-every-event-audited", SC, 'if name in ("scale_up", "scale_down"):',
           'if name != "kept":', (EVENTS_T,),
           "every replica's trace gets a row per phase change, four per scale cycle"),
    # ---- the server's start-up and drain (control/serve/server.py) -----------------------
    Mutant("sv-second-sigterm-forces", SV, "if sig == signal.SIGINT:",
           "if sig in (signal.SIGINT, signal.SIGTERM):", (SIGNALS_TWICE_T,),
           "an orchestrator's repeated SIGTERM cuts the streams still within their grace"),
    Mutant("sv-draining-not-recorded", SV,
           "self._draining = True\n            self._loop", "self._loop", (SIGNALS_TWICE_T,),
           "every signal starts another drain and a second Ctrl+C never forces the exit"),
    Mutant("sv-signal-before-serving", SV, "if self._loop is None:", "if False:",
           (BEFORE_T,), "Ctrl+C while the model loads crashes instead of stopping"),
    Mutant("sv-no-abort-after-grace", SV, '            engine.abort_all("shutdown")\n', "",
           (PAST_GRACE_T,), "requests still running after the grace period are cut without"
           " their final chunk, and shutdown waits 5 s more"),
    Mutant("sv-grace-as-ms", SV, "grace_s = state.settings.shutdown_grace_s",
           "grace_s = state.settings.shutdown_grace_s / 1000", (WITHIN_GRACE_T,),
           "--shutdown-grace-s read as ms: every request in flight is aborted on SIGTERM"),
    Mutant("sv-wait-idle-full-grace", SV, "while state.inflight > 0 and time.monotonic()",
           "while state.inflight >= 0 and time.monotonic()", (PAST_GRACE_T,),
           "an idle server waits its whole grace period before it exits"),
    Mutant("sv-drain-keeps-admitting", SV, "        engine.start_draining()\n", "",
           (WITHIN_GRACE_T,), "during the drain new requests are still admitted: no 503, and"
           " they are aborted at the end"),
    Mutant("sv-drain-never-exits", SV,
           "            await _wait_idle(state, FLUSH_S)\n        self.should_exit = True\n",
           "            await _wait_idle(state, FLUSH_S)\n", (WITHIN_GRACE_T,),
           "after draining the server stays up: SIGTERM never stops it"),
    Mutant("sv-bound-port-ignored", SV, "port = sock.getsockname()[1]", "pass", (ADDRESS_T,),
           "with --port 0 the ready line says port 0: clients cannot find the server"),
    Mutant("sv-edge-url-ignored", SV,
           "        if self.edge_url is not None:\n            return self.edge_url\n", "",
           (ADDRESS_T,), "behind an edge the ready line gives the engine's address, not the"
           " edge's: clients bypass the edge's validation or cannot connect"),
    Mutant("sv-load-failure-exits-zero", SV,
           "            self.exit_code = 1\n            self.should_exit = True\n"
           "            return\n        self.bound_url",
           "            self.should_exit = True\n            return\n        self.bound_url",
           (LOAD_FAILED_T,), "a model that fails to load exits 0: a supervisor does not restart"
           " it or report the failure"),
    Mutant("sv-edge-death-exits-zero", SV,
           "            self.exit_code = 1\n            self.handle_exit(signal.SIGTERM, None)",
           "            self.handle_exit(signal.SIGTERM, None)", (DEAD_EDGE_T,),
           "a server whose edge died stops with exit 0: it looks like a clean shutdown"),
    Mutant("sv-edge-stop-is-a-failure", SV,
           "if not self._draining and self.edge is not None:", "if self.edge is not None:",
           (DEAD_EDGE_T,), "a clean SIGTERM behind an edge exits 1 (the edge stops first)"),
    Mutant("sv-socket-left-behind", SV,
           "        elif self.edge_uds is not None:\n            remove_socket(self.edge_uds)\n",
           "", (SOCKET_T,), "a server that failed before its edge started leaves its socket"
           " and private folder in /tmp"),
    # ---- the simulated executor's shadow KV (engine/sim/shadow_kv.py) --------------------
    Mutant("sk-full-table-refused", SK, "if len(table) * bs < n:", "if len(table) * bs <= n:",
           (PREFIX_T,), "a block table that exactly covers its context is reported as short"),
    Mutant("sk-pool-limit-off-by-one", SK, "if not 0 <= block_id < limit:",
           "if not 0 <= block_id <= limit:", (POOL_T,),
           "a block id one past the pool is accepted: the real runner reads out of bounds"),
    Mutant("sk-negative-block-accepted", SK, "if not 0 <= block_id < limit:",
           "if not block_id < limit:", (NEGATIVE_T,),
           "a block id of -1 reads the pool's last block: a corrupted table goes unseen"),
    Mutant("sk-unknown-pool-refuses-all", SK, 'limit = self.num_blocks or float("inf")',
           "limit = self.num_blocks", (ONE_STEP_T,),
           "a shadow without a pool size refuses every block: every simulated step fails"),
    Mutant("sk-highest-block-not-grown", SK, "self._grow(int(table.max()) * bs + bs)",
           "self._grow(int(table.max()) * bs)", (ONE_STEP_T,),
           "the highest block's slots are past the arrays: the simulation crashes"),
    Mutant("sk-whole-context-written", SK,
           "new = pos >= np.fromiter((q.start for q in seqs), np.int64, len(seqs))[seq_of]",
           "new = pos >= 0", (PREFIX_T,),
           "a prefix hit overwrites the blocks it hit before reading them: a hit on another"
           " request's tokens goes unseen"),
    Mutant("sk-tokens-read-counts-writes", SK, "self.tokens_read += len(slots)",
           "self.tokens_read += len(where)", (COUNTERS_T,),
           "the shadow's read counter misses cached prefixes: a test cannot tell it read them"),
    Mutant("sk-digest-across-sequences", SK, "digests = sums - base[seq_of]",
           "digests = sums", (ONE_STEP_T,),
           "a sequence's digests include the one before it in the batch: a batch of one"
           " request reads back differently than the same request batched"),
    Mutant("sk-slot-without-block-size", SK, "table[(np.cumsum(t_lens) - t_lens)[seq_of]"
           " + pos // bs] * bs", "table[(np.cumsum(t_lens) - t_lens)[seq_of] + pos // bs]",
           (ONE_STEP_T,), "slots are not where build_attention_metadata puts them: blocks"
           " overlap and correct runs fail"),
    Mutant("sk-tokens-compared-not-digests", SK, "bad = self.digests[slots] != digests",
           "bad = self.tokens[slots] != tokens", (PREFIX_T,),
           "the same token after a different prefix passes: wrong K/V is read silently"),
    Mutant("sk-last-mismatch-reported", SK, "i = int(np.argmax(bad))",
           "i = int(len(bad) - 1 - np.argmax(bad[::-1]))", (PREFIX_T,),
           "the mismatch names the last wrong position, not the first: the diagnosis misleads"),
    Mutant("sk-block-named-by-offset", SK, "slot // self.block_size)", "slot % self.block_size)",
           (PREFIX_T,), "the mismatch names the slot's offset as its block"),
    Mutant("sk-token-0-never-written", SK, "if found_pos == UNWRITTEN:", "if found_token == 0:",
           (TOKEN_0_T,), "a wrong block holding token 0 is reported as never written"),
    Mutant("sk-outside-pool-position-is-index", SK,
           "raise ShadowKVMismatch(seq.request_id, i * bs, expected,",
           "raise ShadowKVMismatch(seq.request_id, i, expected,", (OUTSIDE_T,),
           "a block outside the pool is reported at its table index, not its first position"),
    Mutant("sk-block-size-0-accepted", SK, "if block_size < 1:", "if block_size < 0:",
           (SIZE_0_T,), "a shadow of block size 0 is built and fails with ZeroDivisionError"
           " at its first step instead of naming the setting"),
]
