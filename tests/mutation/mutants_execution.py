"""`make mutants` bugs in sampling, structured output, the KV pool and its events, the engine's
records and the offline API (hand-planted 2026-12-07, third pass): each one passed every
test then, and the test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import ENG, Mutant

EXECUTION_MUTANTS: list[Mutant] = [
    Mutant("min-p-drops-at-the-bar", "engine/execution/sampler.py",
           "probs < probs.amax(dim=-1, keepdim=True) * min_p",
           "probs <= probs.amax(dim=-1, keepdim=True) * min_p",
           (ENG + "test_sampler_penalties.py::"
            "test_min_p_of_one_keeps_the_top_token_and_samples_it",),
           "min_p = 1 drops the top token too: every logit is -inf and the row samples garbage"),
    Mutant("generator-not-kept", "engine/execution/exponential_race.py",
           "        req.sampling_state = gen\n",
           "",
           (ENG + "test_sampler_batched.py::test_a_seeded_request_draws_new_noise_at_each_step",),
           "a request's generator is made again every step: a seeded request reuses its first "
           "noise and repeats the same token over a flat distribution"),
    Mutant("prompt-scored-twice", "engine/execution/model_runner.py",
           "first = max(start, len(req.prompt_logprobs))",
           "first = start",
           (ENG + "test_logprobs.py::"
            "test_a_prefill_recomputed_after_a_preemption_scores_only_the_new_positions",),
           "a prefill recomputed after a preemption scores its prompt positions again: prompt "
           "logprobs repeat and shift"),
    Mutant("kv-block-bytes-k-only", "engine/execution/model_runner.py",
           "return 2 * model.num_layers * block_size",
           "return model.num_layers * block_size",
           (ENG + "test_kv_pool_size.py::"
            "test_the_auto_sized_pool_fills_its_budget_in_the_cache_dtype",),
           "the auto-sized KV pool counts K only: it allocates twice its budget (on a GPU, past "
           "its free memory)"),
    Mutant("kv-pool-sized-in-weights-dtype", "engine/execution/model_runner.py",
           "dtype = cpu_dtype.kv_cache_dtype(kv_cache_dtype, loaded.dtype, loaded.dtype_plan)",
           "dtype = loaded.dtype",
           (ENG + "test_kv_pool_size.py::"
            "test_the_auto_sized_pool_fills_its_budget_in_the_cache_dtype",),
           "the auto-sized KV pool counts the weights' dtype: a bf16 cache beside fp32 weights "
           "fills half its budget, an fp32 one beside bf16 weights twice it"),
    Mutant("eos-at-vocab-accepted", "engine/structured/grammar.py",
           "outside = [t for t in stop_token_ids if not 0 <= t < vocab_size]",
           "outside = [t for t in stop_token_ids if not 0 <= t <= vocab_size]",
           (ENG + "test_structured_constrain.py::"
            "test_a_grammar_cache_is_per_eos_and_refuses_an_eos_at_the_logits_width",),
           "an EOS id equal to the logits' width is accepted; xgrammar drops it and the JSON "
           "can never end"),
    Mutant("grammar-cache-ignores-eos", "engine/structured/grammar.py",
           "    key = (vocab_size, eos)\n",
           "    key = (vocab_size,)\n",
           (ENG + "test_structured_constrain.py::"
            "test_a_grammar_cache_is_per_eos_and_refuses_an_eos_at_the_logits_width",),
           "models with one vocabulary but another EOS share a grammar cache: the JSON ends on "
           "the other model's EOS"),
    Mutant("schema-limit-off-by-one", "engine/structured/spec.py",
           "if max_chars is not None and len(text) > max_chars:",
           "if max_chars is not None and len(text) >= max_chars:",
           (ENG + "test_structured_constrain.py::"
            "test_a_schema_of_exactly_max_schema_chars_is_accepted_and_one_more_is_refused",),
           "a schema of exactly MAX_SCHEMA_CHARS is refused"),
    Mutant("allocate-exact-fit-refused", "engine/kv/block_manager.py",
           "if needed > self.num_free:",
           "if needed >= self.num_free:",
           (ENG + "test_block_manager.py::"
            "test_a_request_that_needs_exactly_the_free_blocks_gets_them",),
           "a request that needs exactly the free blocks is refused: the last free block is "
           "never used, requests wait or are preempted with room left"),
    Mutant("evicted-key-not-published", "engine/kv/block_manager.py",
           "                    if self.events is not None:\n"
           "                        self.events.removed(key)\n",
           "",
           (ENG + "test_block_manager.py::test_an_evicted_block_is_published_as_removed",),
           "an evicted block never leaves a router's KV index: it keeps sending that prefix here"),
    Mutant("read-batch-counted-dropped", "engine/kv/events.py",
           "ring[0].seq > self.read_seq:",
           "ring[0].seq >= self.read_seq:",
           (ENG + "test_kv_events.py::test_a_batch_given_to_a_reader_never_counts_as_dropped",),
           "the last batch a reader had counts as dropped when it leaves the ring: the metric "
           "reports lost KV events that were read"),
    Mutant("read-seq-goes-back", "engine/kv/events.py",
           "self.read_seq = max(self.read_seq, self.seq)",
           "self.read_seq = seq",
           (ENG + "test_kv_events.py::test_a_batch_given_to_a_reader_never_counts_as_dropped",),
           "batches a reader was given count as dropped when they leave the ring"),
    Mutant("execute-time-from-step-start", "engine/reports.py",
           "execute_s=t[2] - t[1]",
           "execute_s=t[2] - t[0]",
           (ENG + "test_engine_reports.py::"
            "test_a_step_record_times_each_phase_between_its_own_marks",),
           "a step's execute_s includes its schedule time: the phases add up to more than the "
           "step"),
    Mutant("gauge-reason-overwritten", "engine/reports.py",
           "by_reason[reason] = by_reason.get(reason, 0) + num",
           "by_reason[reason] = num",
           (ENG + "test_engine_reports.py::"
            "test_gauges_count_every_lanes_waiting_requests_under_their_reason",),
           "waiting-by-reason gauges count only the last lane with that reason"),
    Mutant("record-drops-resent", "engine/records.py",
           "trace=req.trace, resent=req.resent,",
           "trace=req.trace,",
           (ENG + "test_engine_reports.py::test_a_record_carries_whether_its_client_resent_it",),
           "a resent request's record (and trace row) says it was not resent"),
    Mutant("whole-step-when-one-ran", "engine/records.py",
           "return self.num_succeeded == 0",
           "return self.num_succeeded <= 1",
           (ENG + "test_step_faults.py::"
            "test_a_step_where_one_request_ran_is_not_a_whole_step_failure",),
           "a step where one request ran counts as a whole-step failure: readiness goes 503 on "
           "a working engine"),
    Mutant("tpot-divides-by-n", "engine/request.py",
           "return (self.token_times[-1] - self.token_times[0]) / (n - 1)",
           "return (self.token_times[-1] - self.token_times[0]) / n",
           (ENG + "test_engine_reports.py::test_tpot_is_the_mean_gap_between_output_tokens",),
           "TPOT divides by every token, not the gaps: reported too low, SLOs judged met"),
    Mutant("prompt-logprobs-never-done", "engine/request.py",
           "and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)",
           "and len(self.prompt_logprobs) < self.num_prompt_tokens)",
           (ENG + "test_logprobs.py::"
            "test_once_its_prompt_is_scored_a_recompute_hits_the_prefix_cache_again",),
           "a request with prompt logprobs skips the prefix cache forever: a recompute after a "
           "preemption computes its whole prompt again"),
    Mutant("vocab-edge-id-accepted", "engine/request.py",
           "out = {name: sorted({t for t in ids if not 0 <= t < vocab_size})",
           "out = {name: sorted({t for t in ids if not 0 <= t <= vocab_size})",
           (ENG + "test_sampler_penalties.py::"
            "test_a_token_id_equal_to_the_vocabulary_size_is_outside_it",),
           "LLM accepts a logit_bias or stop id equal to the vocabulary size, and silently "
           "ignores it"),
    Mutant("greedy-epsilon-ignored", "engine/request.py",
           "if 0.0 < self.temperature < GREEDY_BELOW:",
           "if 0.0 < self.temperature < 0.0:",
           (ENG + "test_sampler_batched.py::"
            "test_a_temperature_below_the_greedy_epsilon_samples_the_argmax",),
           "a temperature of 1e-40 is not greedy: logits / T overflow and the row samples "
           "garbage"),
    Mutant("stop-string-ends-cancelled", "engine/llm.py",
           'self.engine.abort(request_id, RequestStatus.STOPPED, "stop string")',
           "self.engine.abort(request_id)",
           ("tests/llm/test_generate.py::"
            "test_a_stop_string_ends_the_request_stopped_in_its_record",),
           "an offline request ended by a stop string is recorded as cancelled"),
    Mutant("max-model-len-limit-off-by-one", "engine/llm.py",
           "if len(ids) + params.max_tokens > limit:",
           "if len(ids) + params.max_tokens >= limit:",
           ("tests/llm/test_generate.py::test_a_prompt_that_fills_max_model_len_exactly_runs",),
           "a prompt whose prompt + max_tokens equals max_model_len is refused"),
    Mutant("model-context-not-capped", "engine/llm.py",
           'static_kw["max_model_len"] = min(static_kw.get("max_model_len", 1 << 30),\n'
           "                                     loaded.max_model_len)",
           'static_kw["max_model_len"] = static_kw.get("max_model_len", loaded.max_model_len)',
           ("tests/llm/test_generate.py::"
            "test_max_model_len_past_the_models_context_is_capped_to_it",),
           "max_model_len past the model's context is kept: positions past it run"),
]
