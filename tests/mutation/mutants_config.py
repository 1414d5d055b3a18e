"""The engine's config loading and live patches, structured-output slots, the simulator,
the start-up probe and the demos (pass of 2026-12-07); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import ENG, SEC, Mutant

ENGINE_CONFIG_MUTANTS: list[Mutant] = [
    Mutant("config-bool-as-float", "engine/config/field_types.py",
           "if isinstance(value, bool) and expected in (int, float):",
           "if isinstance(value, bool) and expected is int:",
           (ENG + "test_config.py::"
            "test_a_boolean_is_not_a_number_for_a_fraction_or_a_weight",),
           "`kv_cache_reject_watermark: true` loads as 1 (nothing is ever rejected) and"
           " `weight: true` as a lane weight of 1"),
    Mutant("config-empty-file-refused", "engine/config/yaml_loader.py",
           "return load_config_dict(read_yaml_file(path) or {})",
           "return load_config_dict(read_yaml_file(path))",
           (ENG + "test_config.py::"
            "test_an_empty_file_or_an_empty_serving_block_loads_the_defaults",),
           "an empty config file fails the start ('config must be a mapping') instead of"
           " loading the defaults"),
    Mutant("config-null-serving-refused", "engine/config/yaml_loader.py",
           'serving = _normalise(data.get("serving") or {}, "serving")',
           'serving = _normalise(data.get("serving", {}), "serving")',
           (ENG + "test_config.py::"
            "test_an_empty_file_or_an_empty_serving_block_loads_the_defaults",),
           "a YAML with an empty `serving:` block fails the start"),
    Mutant("config-hint-too-loose", "engine/config/known_keys.py",
           "CLOSE_ENOUGH = 0.8", "CLOSE_ENOUGH = 0.6",
           (ENG + "test_config.py::test_a_key_only_loosely_like_a_known_one_gets_no_hint",),
           "an operator's `batch_size` is answered 'did you mean block_size?' (a change of the"
           " KV layout)"),
    Mutant("profile-refusal-without-fitted", "engine/config/yaml_loader.py",
           "config.live.replace(**changes).validate(config.static, fitted)",
           "config.live.replace(**changes).validate(config.static)",
           (ENG + "test_config.py::"
            "test_a_profile_refused_at_start_says_which_static_value_the_model_chose",),
           "a start refused on a profile cites a max_model_len the YAML never set, without"
           " saying the model chose it"),
    Mutant("config-version-a-live-key", "engine/config/yaml_loader.py",
           'LIVE_KEYS = {f.name for f in dataclasses.fields(LiveConfig)} - {"lanes", "version"}',
           'LIVE_KEYS = {f.name for f in dataclasses.fields(LiveConfig)} - {"lanes"}',
           (ENG + "test_config_patch.py::test_an_invalid_change_names_its_field",
            ENG + "test_config.py::test_unknown_keys_are_errors_that_list_the_allowed_keys"),
           "a PATCH or YAML setting `version` is accepted and silently ignored"),
    Mutant("patch-default-slo-replaced", "engine/config/patch.py",
           '    data["default_slo"] = live.default_slo.to_dict()\n', "",
           (ENG + "test_config_patch.py::test_a_patch_of_one_default_slo_target_keeps_the_other",),
           "a live patch of default_slo.ttft_s drops its tpot_s, and the config as data holds"
           " an object JSON cannot serve"),
    Mutant("compile-slots-capacity-zero", "engine/structured/compile_slots.py",
           "if capacity < 1:", "if capacity < 0:",
           (SEC + "test_structured_limits.py::test_compile_slots_refuse_a_capacity_below_one",),
           "compile slots of capacity 0 are built, and every structured request is a 429"),
    Mutant("shadow-kv-prefix-label-on-any-token", "engine/sim/shadow_kv.py",
           "if found_pos == p and found_token == expected:", "if found_pos == p:",
           (ENG + "test_shadow_kv.py::"
            "test_another_token_at_the_same_position_is_reported_as_that_token",),
           "a wrong block (another request's token) is diagnosed as a different prefix"),
    Mutant("sim-idle-jump-skips-resends", "engine/sim/simulate.py",
           "clock.now = max(clock.now, min(due + [s.at for s in resends[:1]]))",
           "clock.now = max(clock.now, min(due or [s.at for s in resends[:1]]))",
           (ENG + "test_sim_client_retries.py::"
            "test_a_resend_due_before_the_next_arrival_is_sent_on_time",),
           "a simulated client's resend waits for the next trace arrival, however late"),
    Mutant("sim-resend-not-marked", "engine/sim/simulate.py",
           "resent=send.sends > 1, **kwargs)", "resent=False, **kwargs)",
           (ENG + "test_sim_client_retries.py::"
            "test_resent_requests_come_back_after_the_delay_and_keep_their_first_send",),
           "a simulated resend's record is not marked resent (counted as a new user request)"),
    Mutant("sim-arrival-at-step-end", "engine/sim/simulate.py",
           "forced_params(item.output_tokens), arrival_time=send.at,",
           "forced_params(item.output_tokens), arrival_time=engine.clock(),",
           (ENG + "test_sim_workload.py::"
            "test_a_request_arriving_during_a_step_keeps_its_trace_arrival_time",),
           "a request arriving during a simulated step counts its queue delay and TTFT from the"
           " step's end: latencies understated"),
    Mutant("trace-replay-stops-at-eos", "engine/sim/workload.py",
           "return SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)",
           "return SamplingParams(max_tokens=output_tokens, temperature=0.0)",
           (ENG + "test_sim_workload.py::"
            "test_a_replay_gets_the_trace_output_lengths_whatever_the_model_samples",),
           "a trace replay ends requests at the model's EOS, not at the trace's lengths"),
    Mutant("trace-scale-describes-prompt-as-output", "engine/sim/workload.py",
           "output lengths / {self.output_div:g}", "output lengths / {self.prompt_div:g}",
           (ENG + "test_sim_workload.py::"
            "test_the_scale_a_report_prints_is_each_of_its_own_factors",),
           "a report prints the prompt scale as the output scale"),
    Mutant("trace-prompt-floor-ignored", "engine/sim/workload.py",
           "prompt_tokens=max(scale.min_tokens,", "prompt_tokens=max(1,",
           (ENG + "test_sim_workload.py::test_scaled_lengths_keep_the_floor_of_min_tokens",),
           "scaled trace prompts go below min_tokens (the demo's 'at least 4 each' is false)"),
    Mutant("probe-decode-blocks-not-whole", "engine/calibration/probe.py",
           "per_decode = pool_tokens // block_size // batch * block_size",
           "per_decode = pool_tokens // batch",
           (ENG + "test_step_probe.py::"
            "test_decode_probes_fit_a_pool_that_is_not_a_whole_number_of_blocks_per_decode",),
           "the start-up probe's decodes need more blocks than the pool has: the start fails"),
    Mutant("probe-decode-past-its-context", "engine/calibration/probe.py",
           "req.num_computed_tokens = context - 1", "req.num_computed_tokens = context",
           (ENG + "test_step_probe.py::"
            "test_a_decode_probe_computes_the_last_token_of_its_context_inside_its_blocks",),
           "a decode probe computes a position past its blocks (out of its KV, or a crash)"),
    Mutant("probe-decode-context-of-one", "engine/calibration/probe.py",
           'lambda b, c, t: StepProbe(b, b, 0, b * c, t, f"decode {b} x {c}"))',
           'lambda b, c, t: StepProbe(b, b, 0, c, t, f"decode {b} x {c}"))',
           (ENG + "test_step_probe.py::"
            "test_a_decode_probe_records_the_context_every_decode_of_its_batch_reads",),
           "the step law's KV-read cost is fitted on one decode's context: batches overpriced"),
    Mutant("probe-pool-exactly-full-refused", "engine/calibration/probe.py",
           "if first_block + num_blocks > self.runner.num_kv_blocks:",
           "if first_block + num_blocks >= self.runner.num_kv_blocks:",
           (ENG + "test_step_probe.py::test_decode_probes_may_fill_the_whole_pool",),
           "a start-up whose pool divides evenly among the probe's decodes fails"),
    Mutant("probe-ramp-of-one-size", "engine/calibration/probe.py",
           "    if len(sizes) < 2:\n        sizes = [max(1, max_tokens // 2), max_tokens]",
           "    if not sizes:\n        sizes = [max_tokens]",
           (ENG + "test_step_probe.py::"
            "test_a_step_budget_under_two_ramp_sizes_still_probes_two_prefill_sizes",),
           "a step budget under 32 tokens probes one prefill size: no cost per prompt token"),
    Mutant("replay-demo-outcomes-not-counted", "engine/demos/replay.py",
           "outcomes[rec.finish_reason] = outcomes.get(rec.finish_reason, 0) + 1",
           "outcomes[rec.finish_reason] = 1",
           (ENG + "test_demos.py::test_the_replay_demo_reports_every_request_and_its_output_rate",),
           "the replay demo reports one request per outcome"),
    Mutant("replay-demo-tokens-per-step", "engine/demos/replay.py",
           'f" {result.output_tokens / result.sim_seconds:.1f} output tokens/s")',
           'f" {result.output_tokens / result.steps:.1f} output tokens/s")',
           (ENG + "test_demos.py::test_the_replay_demo_reports_every_request_and_its_output_rate",),
           "the replay demo's tokens/s is tokens per step"),
    Mutant("chat-demo-tpot-in-seconds", "engine/demos/chat.py",
           "TPOT {1000 * (m.tpot_s or 0):.0f}ms", "TPOT {(m.tpot_s or 0):.0f}ms",
           (ENG + "test_demos.py::test_the_chat_demo_prints_tpot_in_milliseconds",),
           "the chat demo prints TPOT 0ms for every answer"),
    Mutant("chat-demo-forgets-answers", "engine/demos/chat.py",
           '        history.append({"role": "assistant", "content": out.text})\n', "",
           (ENG + "test_demos.py::"
            "test_the_interactive_chat_sends_the_whole_conversation_each_turn",),
           "the interactive chat sends the model a conversation without its own answers"),
]
