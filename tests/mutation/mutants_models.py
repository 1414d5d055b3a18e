"""Model loading, the GGUF cache and the model code's own checks (pass of 2026-12-07); each
has a test that fails on it."""

from __future__ import annotations

from mutant_spec import ENG, KRN, MDL, SEC, Mutant

MODELS_MUTANTS: list[Mutant] = [
    Mutant("head-dim-from-hidden-over-heads", "engine/models/llama.py",
           'return getattr(config, "head_dim", None) or config.hidden_size',
           "return config.hidden_size",
           (MDL + "test_architectures.py::test_architecture_matches_transformers",),
           "a model whose config sets head_dim apart from hidden/heads (Mistral Nemo) fails "
           "to load"),
    Mutant("gguf-suffix-case-sensitive", "engine/models/sources.py",
           'path.suffix.lower() != ".gguf"', 'path.suffix != ".gguf"',
           (MDL + "test_loader.py::"
            "test_a_gguf_file_with_an_upper_case_suffix_is_a_gguf_file",),
           "a model file named MODEL.GGUF is refused as 'not a .gguf file'"),
    Mutant("hidden-act-unchecked", "engine/models/llama.py",
           'if getattr(config, "hidden_act", "silu") != "silu":', "if False:",
           (MDL + "test_loader.py::test_an_activation_other_than_silu_is_refused",),
           "a gelu model loads and runs with silu: fluent-looking wrong text, no error"),
    Mutant("eos-generation-config-ignored", "engine/models/loader.py",
           "if generation_config.is_file():", "if False:",
           (MDL + "test_loader.py::"
            "test_eos_ids_come_from_config_generation_config_and_tokenizer",),
           "a chat model whose generation_config.json adds <|im_end|> never stops at it"),
    Mutant("eos-tokenizer-ignored", "engine/models/loader.py",
           '    sources.append(getattr(tokenizer, "eos_token_id", None))\n', "",
           (MDL + "test_loader.py::"
            "test_eos_ids_come_from_config_generation_config_and_tokenizer",),
           "generation runs past the tokenizer's end-of-sequence token to max_tokens"),
    Mutant("inv-freq-key-refused", "engine/models/loader.py",
           '        if not name.endswith("rotary_emb.inv_freq")\n', "",
           (MDL + "test_loader.py::test_a_checkpoint_that_saved_rotary_inv_freq_loads",),
           "an older checkpoint that saved rotary_emb.inv_freq is refused as mismatched"),
    Mutant("tilde-path-not-a-path", "engine/models/sources.py",
           'text.startswith((".", "~"))', 'text.startswith(".")',
           (MDL + "test_loader.py::test_missing_path_says_what_to_pass",),
           "a mistyped ~/ model path is reported as an unknown alias, not a missing file"),
    Mutant("gguf-cache-stores-bf16", "engine/models/loader.py",
           "if is_gguf and dtype == torch.float32:", "if is_gguf:",
           (MDL + "test_loader.py::"
            "test_only_a_float32_gguf_load_writes_the_converted_copy",),
           "after one bf16 load of a GGUF every float32 load runs bf16-rounded weights"),
    Mutant("partial-rotary-unchecked", "engine/models/rope.py",
           "if partial not in (None, 1, 1.0):", "if False:",
           (MDL + "test_rope.py::test_partial_rotary_is_refused",),
           "a partial-rotary model loads and rotates every dimension: wrong text, no error"),
    Mutant("gqa-heads-unchecked", "engine/models/attention.py",
           "if num_heads % num_kv_heads != 0:", "if False:",
           (MDL + "test_attention_checks.py::"
            "test_query_heads_that_kv_heads_do_not_divide_are_refused",),
           "a config whose KV heads do not divide its query heads runs on the wrong keys"),
    Mutant("block-count-unchecked", "engine/models/attention.py",
           " or len(blocks) * block_size < ctx:", ":",
           (MDL + "test_attention_checks.py::"
            "test_a_sequence_with_too_few_blocks_for_its_context_is_refused",),
           "a sequence short of blocks writes and reads K/V outside its own blocks"),
    Mutant("query-longer-than-context", "engine/models/attention.py",
           "if not 0 <= q_len <= ctx or", "if not 0 <= q_len or",
           (MDL + "test_attention_checks.py::"
            "test_a_query_longer_than_its_context_is_refused",),
           "a step whose query outruns its context gets negative positions, not an error"),
    Mutant("native-block-past-cache", "engine/models/native_decode.py",
           "and ids[1] < k_cache.shape[0])", "and ids[1] <= k_cache.shape[0])",
           (KRN + "test_cpu_layers.py::"
            "test_a_context_block_past_the_end_of_the_cache_is_not_read_natively",),
           "the native decode reads a block past the end of the KV cache (raw memory)"),
    Mutant("gguf-cache-marker-unchecked", "engine/models/gguf_cache.py",
           "if not (target / _MARKER).is_file():", "if not target.is_dir():",
           (SEC + "test_gguf_cache_key.py::"
            "test_a_converted_copy_without_its_completion_marker_is_not_used",),
           "a converted copy whose save never finished is loaded as the model"),
    Mutant("gguf-cache-store-when-off", "engine/models/gguf_cache.py",
           "    if not enabled():\n        return\n    target = converted_dir(gguf)\n    try:",
           "    target = converted_dir(gguf)\n    try:",
           (SEC + "test_gguf_cache_key.py::test_cache_switched_off_writes_nothing",),
           "BATCHPILOT_GGUF_CACHE=0 still writes a converted copy of every GGUF to disk"),
    Mutant("gguf-digest-memo-no-ctime", "engine/models/gguf_cache.py",
           "st.st_mtime_ns, st.st_ctime_ns)", "st.st_mtime_ns)",
           (SEC + "test_gguf_cache_key.py::test_a_file_rewritten_in_place_is_hashed_again",),
           "a GGUF rewritten in place with its mtime kept gets the old model's converted copy"),
    Mutant("malloc-trim-not-set", "engine/execution/native_heap.py",
           "== 1\n            and mallopt", "== 1\n            or mallopt",
           (ENG + "test_native_heap.py::test_both_thresholds_are_set",),
           "glibc still trims the heap's free top: steps fault their temporaries in again"),
]
