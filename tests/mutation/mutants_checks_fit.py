"""The go-live checklist's config checks and the start-up budget fit (pass of 2026-12-07,
late: each had one planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

CHECKS = "control/checklist/checks_config.py"
FIT = "engine/calibration/budget_fit.py"
CHECKLIST_T = CTL + "checklist/test_checklist.py"
CONFIG_CHECKS_T = CTL + "checklist/test_checks_config.py"
FIT_T = CTL + "serve/test_budget_fitting.py"
FIT_RULES_T = CTL + "serve/test_budget_fit_rules.py"
OPERATOR_T = FIT_T + "::test_values_the_operator_set_are_never_overridden"
SLOW_T = FIT_T + "::test_the_fit_keeps_a_full_step_under_the_target_on_a_slow_device"
TOO_SLOW_T = FIT_T + "::test_a_device_too_slow_for_one_chunk_still_leaves_a_third_beside_it"
FAST_T = FIT_T + "::test_a_fast_device_keeps_the_built_in_defaults"
UNREACHABLE_T = (FIT_T + "::test_an_unreachable_target_keeps_the_fixed_cost_at_most_half_a_step"
                 "_and_says_so")
MINIMUM_T = CONFIG_CHECKS_T + "::test_a_limit_set_exactly_to_its_minimum_passes"
LANE_CAP_T = CONFIG_CHECKS_T + "::test_a_lane_capped_above_max_num_seqs_fails_as_no_cap"
NO_BATCH_T = CONFIG_CHECKS_T + "::test_a_config_without_the_batch_lane_passes_and_says_so"
REJECT_T = (CONFIG_CHECKS_T + "::test_a_reject_watermark_past_the_whole_pool_fails_and_the_whole"
            "_pool_passes")
CHUNK_T = CONFIG_CHECKS_T + "::test_a_chunk_exactly_one_steps_budget_passes"
SHARE_T = CONFIG_CHECKS_T + "::test_the_specs_budget_share_of_the_kv_pool_is_the_limit_judged"
SEQS_T = CONFIG_CHECKS_T + "::test_more_sequences_than_kv_blocks_fails_even_when_the_budget_fits"
TENANTS_T = CONFIG_CHECKS_T + "::test_each_tenant_the_spec_names_must_be_routed_to_a_lane"
TPOT_T = CONFIG_CHECKS_T + "::test_a_lane_with_a_ttft_target_but_no_tpot_target_fails_slo_set"
NOTE_T = FIT_RULES_T + "::test_budgets_fitted_within_the_target_carry_no_note"
POOL_T = FIT_RULES_T + "::test_the_probes_stay_within_a_kv_pool_smaller_than_max_model_len"
BANNER_T = FIT_RULES_T + "::test_the_banner_says_which_budget_the_operator_set"

CHECKS_FIT_MUTANTS: list[Mutant] = [
    # ---- the checklist's checks of the serving config ---------------------------------------
    Mutant("limits-minimum-exclusive", CHECKS, "values[key] is None or values[key] < low",
           "values[key] is None or values[key] <= low", (MINIMUM_T,),
           "a limit set exactly to the spec's minimum fails go-live"),
    Mutant("limits-lane-cap-over-seqs-passes", CHECKS,
           'elif key.endswith("max_running") and values[key] > seqs:', "elif False:",
           (LANE_CAP_T,),
           "a batch lane capped at more sequences than the server runs passes as capped"),
    Mutant("limits-absent-lane-unsaid", CHECKS, "    if absent:\n", "    if False:\n",
           (NO_BATCH_T,),
           "a config with no batch lane passes limits_set without saying the lane is absent"),
    Mutant("watermarks-reject-over-pool", CHECKS, "if not 0.0 < high < reject <= 1.0:",
           "if not 0.0 < high < reject:", (REJECT_T,),
           "a reject watermark of 1.2 (past the pool: never rejects) passes"),
    Mutant("watermarks-gap-as-percent", CHECKS, 'if reject - high < p["min_gap"]:',
           'if reject - high < p["min_gap"] / 100:', (CHECKLIST_T,),
           "watermarks 0.005 apart pass: prefills stop and rejections start together"),
    Mutant("chunk-equal-to-budget-fails", CHECKS, "        if chunk > budget:",
           "        if chunk >= budget:", (CHUNK_T,),
           "a chunk exactly the step's token budget (it fits) fails go-live"),
    Mutant("kv-budget-share-ignored", CHECKS, 'limit = pool * p["max_budget_share"]',
           "limit = pool", (SHARE_T,),
           "a spec's max_budget_share of 0.5 is ignored: a budget of 80% of the pool passes"),
    Mutant("kv-seqs-against-pool-tokens", CHECKS, "if seqs > blocks:",
           "if seqs > blocks * block_size:", (SEQS_T,),
           "more sequences than KV blocks (each needs one) pass go-live"),
    Mutant("lanes-ratio-against-lightest", CHECKS,
           "heaviest = max(others.items(), key=lambda kv: kv[1], default=None)",
           "heaviest = min(others.items(), key=lambda kv: kv[1], default=None)",
           (CHECKLIST_T,),
           "an interactive lane lighter than long_context passes (judged against batch)"),
    Mutant("lanes-tenants-unchecked", CHECKS, '    if p["tenants"]:\n', "    if False:\n",
           (TENANTS_T,),
           "a tenant the spec names passes go-live while tenant_lanes does not route it"),
    Mutant("slo-default-ignored", CHECKS,
           '(settings or {}).get("slo") or default for name',
           '(settings or {}).get("slo") or {} for name', (CHECKLIST_T,),
           "lanes that take default_slo's targets read as having none"),
    Mutant("slo-tpot-not-required", CHECKS, 'for key in ("ttft_s", "tpot_s")',
           'for key in ("ttft_s",)', (TPOT_T,),
           "an interactive lane with a TTFT target but no TPOT target passes slo_set"),
    # ---- the start-up budget fit -----------------------------------------------------------
    Mutant("fit-overrides-operator-values", FIT,
           "kept = {k: getattr(live, k) for k in FITTED_FIELDS if k in explicit}",
           "kept = {}", (OPERATOR_T,),
           "the operator's prefill_chunk_size is replaced by a fitted one"),
    Mutant("fit-skipped-when-one-is-set", FIT, "and not set(FITTED_FIELDS) <= explicit",
           "and not set(FITTED_FIELDS) & explicit", (OPERATOR_T,),
           "setting only prefill_chunk_size leaves the 8192-token budget unfitted"),
    Mutant("fit-target-ms-as-seconds", FIT, "target_s = static.target_step_ms / 1000",
           "target_s = static.target_step_ms", (SLOW_T,),
           "the budgets are fitted to 250 s steps: a slow device keeps the defaults"),
    Mutant("fit-chunk-takes-whole-step", FIT, "room = min(step_tokens * CHUNK_SHARE,",
           "room = min(step_tokens,", (SLOW_T,),
           "a chunk takes the whole step: decodes and new prompts wait behind long prefills"),
    Mutant("fit-chunk-under-min", FIT,
           "chunk = min(max(MIN_CHUNK, _pow2_floor(room)), live.prefill_chunk_size)",
           "chunk = min(_pow2_floor(room), live.prefill_chunk_size)", (TOO_SLOW_T,),
           "a very slow device gets 8-token chunks"),
    Mutant("fit-budget-over-default", FIT,
           "budget = max(min(step_tokens, live.max_num_batched_tokens), floor)",
           "budget = max(step_tokens, floor)", (FAST_T,),
           "a fast device gets a token budget above the built-in default"),
    Mutant("fit-chunk-ignores-operator-budget", FIT,
           'kept.get("max_num_batched_tokens", 1 << 30)', "1 << 30", (OPERATOR_T,),
           "an operator's budget of 96 gets a fitted chunk of 128 that never fits a step"),
    Mutant("fit-no-fixed-cost-floor", FIT,
           "    step_tokens = max(law.affordable_chunk(0, target_s - law.fixed_s),\n"
           "                      law.affordable_chunk(0, law.fixed_s))",
           "    step_tokens = law.affordable_chunk(0, target_s - law.fixed_s)", (UNREACHABLE_T,),
           "on a device too slow for the target, steps are cut to a few tokens"),
    Mutant("fit-over-target-note-in-seconds", FIT,
           "if predicted > fit.target_step_ms:",
           "if predicted > fit.target_step_ms / 1000:", (NOTE_T,),
           "every fitted start-up says the target is missed"),
    Mutant("fit-flat-law-blamed-on-any-slow-device", FIT,
           "if fit.law.token_s == 0 and fit.law.prefill_pair_s == 0:",
           "if fit.law.fixed_s * 1000 > fit.target_step_ms:",
           (FIT_RULES_T + "::test_probes_that_cost_the_same_at_every_size_are_called_out_not"
            "_called_a_fit",),
           "a device that is merely slow is told its probes ran beside other work"),
    Mutant("fit-flat-law-kept-defaults-already-fit", FIT,
           "    if predicted > fit.target_step_ms:\n",
           "    if predicted > fit.target_step_ms and fit.law.token_s > 0:\n",
           (FIT_RULES_T + "::test_probes_that_cost_the_same_at_every_size_are_called_out_not"
            "_called_a_fit",),
           "start-up on a busy machine says the built-in budgets already fit steps it"
           " predicts at ten times the target"),
    Mutant("fit-defaults-note-on-any", FIT,
           "if all(v == getattr(live, k) for k, v in fit.fitted.items()):",
           "if any(v == getattr(live, k) for k, v in fit.fitted.items()):", (NOTE_T,),
           "a budget fitted below the default is reported as the defaults already fitting"),
    Mutant("fit-probes-past-the-pool", FIT, "max_context = min(static.max_model_len, pool)",
           "max_context = static.max_model_len", (POOL_T,),
           "a KV pool smaller than max_model_len fails start-up: the probes ask for more"
           " blocks than it has"),
    Mutant("fit-banner-hides-kept", FIT,
           "                if self.kept else \"\")", "                if False else \"\")",
           (BANNER_T,), "the ready banner does not say which budget the operator set"),
    Mutant("fit-banner-kept-as-fitted", FIT,
           "for k, v in self.fitted.items())  # never empty",
           "for k, v in {**self.fitted, **self.kept}.items())  # never empty", (BANNER_T,),
           "the banner lists the operator's chunk among the budgets 'fitted to' the target"),
]
