"""The serving config's schema and the fleet's autoscaling policy (pass of 2026-12-07, late:
each had one planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

SCHEMA = "engine/config/schema.py"
AUTOSCALE = "control/fleet/autoscale.py"
CONFIG_T = ENG + "test_config.py"
BUDGET_T = "tests/control/serve/test_budget_fitting.py"
SCHEMA_T = ENG + "test_config_schema.py"
EDGE_T = SCHEMA_T + "::test_a_value_just_past_a_bound_is_refused_naming_it_and_the_bound_is_served"
RULE_T = CTL + "fleet/test_fleet_autoscale_rule.py"
WANTED_T = RULE_T + "::test_the_fleet_wants_one_more_on_pressure_and_one_fewer_when_idle"
BAD_SETTING_T = RULE_T + "::test_a_bad_setting_is_an_error_that_names_it"

CONFIG_AUTOSCALE_MUTANTS: list[Mutant] = [
    # ---- engine/config/schema.py ------------------------------------------------------
    Mutant("config-block-size-any", SCHEMA,
           "_require(self.block_size in (8, 16, 32, 64, 128),",
           "_require(self.block_size >= 8,", (CONFIG_T,),
           "block_size: 12 is loaded: the KV pool's blocks no longer match the kernels'"
           " tiles"),
    Mutant("config-target-step-unbounded", SCHEMA,
           "0 <= self.target_step_ms <= 60_000", "0 <= self.target_step_ms", (BUDGET_T,),
           "target_step_ms: 600000 (seconds typed as ms twice) fits ten-minute steps"),
    Mutant("config-lane-weight-nan", SCHEMA,
           "_require(0 < self.weight <= MAX_LANE_WEIGHT,",
           "_require(not (self.weight <= 0 or self.weight > MAX_LANE_WEIGHT),", (CONFIG_T,),
           "weight: .nan is loaded: every lane's share of the token budget becomes nan"),
    Mutant("config-lane-limit-zero", SCHEMA,
           "_require(value is None or value >= 1,", "_require(value is None or value >= 0,",
           (CONFIG_T,),
           "a lane's max_running: 0 is loaded: its requests queue and never run"),
    Mutant("config-watermarks-equal", SCHEMA,
           "0.0 < self.kv_cache_high_watermark < self.kv_cache_reject_watermark <= 1.0",
           "0.0 < self.kv_cache_high_watermark <= self.kv_cache_reject_watermark <= 1.0",
           (EDGE_T,),
           "high and reject watermarks equal: no band where requests queue for KV, the"
           " first one over is rejected outright"),
    Mutant("config-max-seqs-limit-exclusive", SCHEMA,
           "1 <= self.max_num_seqs <= MAX_NUM_SEQS_LIMIT",
           "1 <= self.max_num_seqs < MAX_NUM_SEQS_LIMIT", (CONFIG_T,),
           "max_num_seqs: 8192, the documented limit, is refused"),
    Mutant("config-long-context-lane-unchecked", SCHEMA,
           "_require(self.long_context_lane is None or self.long_context_lane in names,",
           "_require(True,",
           (EDGE_T, SCHEMA_T + "::test_removing_the_long_context_lane_live_is_refused_and"
            "_nothing_changes"),
           "long_context_lane names a lane that is gone: every long prompt is routed to it"
           " instead of the config being refused"),
    Mutant("config-chunk-equal-context-refused", SCHEMA,
           "_require(self.prefill_chunk_size <= static.max_model_len,",
           "_require(self.prefill_chunk_size < static.max_model_len,",
           (SCHEMA_T + "::test_a_prefill_chunk_as_long_as_the_context_is_served_and_one"
            "_token_more_is_not",),
           "prefill_chunk_size equal to max_model_len (one chunk per prompt) is refused"),
    Mutant("config-lane-slo-ignored", SCHEMA,
           "return lane.slo if lane.slo is not None else self.default_slo",
           "return self.default_slo",
           (SCHEMA_T + "::test_a_lane_with_its_own_slo_is_judged_by_it_and_one_without_by"
            "_the_default",),
           "a lane's own SLO is ignored: interactive requests are judged by the default"
           " (none), never shed or sized for by their TTFT target"),
    Mutant("config-static-not-validated", SCHEMA,
           "        self.static.validate()\n        self.live.validate(",
           "        self.live.validate(", (BUDGET_T,),
           "a bad static setting (block_size, target_step_ms) given to the engine directly"
           " is never refused"),
    Mutant("config-step-policy-unchecked", SCHEMA,
           "_require(self.step_policy in STEP_POLICIES,", "_require(True,", (EDGE_T,),
           "step_policy: godput (a typo) is loaded and silently runs as another policy"),
    Mutant("config-stream-idle-zero", SCHEMA,
           "_require(self.stream_idle_timeout_ms >= 1,",
           "_require(self.stream_idle_timeout_ms >= 0,", (EDGE_T,),
           "stream_idle_timeout_ms: 0 is loaded: every stream is cut as idle at once"),
    # ---- control/fleet/autoscale.py ---------------------------------------------------
    Mutant("autoscale-min-above-max", AUTOSCALE,
           "if not 1 <= self.min_replicas <= self.max_replicas:",
           "if not 1 <= self.min_replicas:", (BAD_SETTING_T,),
           "min_replicas above max_replicas is taken: a fleet that can never reach its"
           " floor, instead of a refusal"),
    Mutant("autoscale-infinite-threshold", AUTOSCALE,
           'if not 0.0 <= value < float("inf"):', "if value < 0.0:", (BAD_SETTING_T,),
           "up_waiting=inf (or nan) is taken: the fleet never scales up on a queue"),
    Mutant("autoscale-hysteresis-equal", AUTOSCALE,
           "if self.down_kv_usage >= self.up_kv_usage:",
           "if self.down_kv_usage > self.up_kv_usage:", (BAD_SETTING_T,),
           "down_kv_usage equal to up_kv_usage is taken: no hysteresis, the fleet flaps"),
    Mutant("autoscale-bool-is-number", AUTOSCALE,
           "if isinstance(value, bool) or not isinstance(value, int | float) or (",
           "if not isinstance(value, int | float) or (", (BAD_SETTING_T,),
           "up_kv_usage: true is read as 1.0: the fleet never scales on KV"),
    Mutant("autoscale-burst-past-max", AUTOSCALE,
           'return min(cfg.max_replicas, max(n + 1, enough)), "waiting"',
           'return max(n + 1, enough), "waiting"', (WANTED_T,),
           "a burst makes the fleet want more replicas than max_replicas: the Fleet page"
           " and `fleet autoscale` report a target the fleet can never have"),
    Mutant("autoscale-queue-share-mean", AUTOSCALE,
           "share = max(s.queue_slo_share for s in routed)",
           "share = sum(s.queue_slo_share for s in routed) / n", (WANTED_T,),
           "one replica whose queue is about to miss a lane's TTFT target is averaged away"
           " by idle ones: no scale-up"),
    Mutant("autoscale-up-waiting-zero-scales-idle", AUTOSCALE,
           "if waiting / n >= cfg.up_waiting and waiting > 0:",
           "if waiting / n >= cfg.up_waiting:",
           (RULE_T + "::test_up_waiting_zero_scales_on_any_queue_and_never_on_none",),
           "up_waiting=0 (scale on any queue) grows an idle fleet to max_replicas"),
    Mutant("autoscale-idle-judged-on-current-fleet", AUTOSCALE,
           "running <= cfg.down_running * (n - 1)", "running <= cfg.down_running * n",
           (WANTED_T,),
           "a replica is retired while what runs does not fit the smaller fleet: it scales"
           " back up at once"),
    Mutant("autoscale-downscale-uses-upscale-delay", AUTOSCALE,
           "_after(state, cfg.downscale_delay_s,", "_after(state, cfg.upscale_delay_s,",
           (RULE_T + "::test_an_idle_slot_drains_after_the_downscale_delay_not_the_upscale"
            "_one",),
           "a replica starts draining after 5 s of idleness instead of downscale_delay_s:"
           " the fleet shrinks in every lull"),
    Mutant("autoscale-idle-timer-not-reset", AUTOSCALE,
           "    if wants or state.phase == \"starting\":\n"
           "        return 1, dataclasses.replace(state, since=None)",
           "    if wants or state.phase == \"starting\":\n        return 1, state",
           (RULE_T + "::test_load_between_idle_spells_restarts_the_downscale_delay",),
           "idle spells broken by load add up: a replica busy between them drains as soon"
           " as their sum reaches downscale_delay_s"),
    Mutant("autoscale-drain-skipped", AUTOSCALE,
           '(1, 1), "retiring")', '(1, 0), "retiring")',
           (RULE_T + "::test_an_idle_slot_drains_before_it_goes_to_zero",),
           "a scale-down stops the replica at once: its running requests are cut short"),
    Mutant("autoscale-kept-during-hold", AUTOSCALE,
           "if wants and signals.hold is None:", "if wants:",
           (RULE_T + "::test_a_hold_keeps_a_retiring_slot_draining_even_when_pressure"
            "_returns",),
           "a retiring replica is taken back into routing during a canary or rolling"
           " restart, which counts on the replicas it began with"),
]
