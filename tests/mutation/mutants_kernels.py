"""The kernels' Python side (pass of 2026-12-07): dispatch, step plans, backends, the
reference, the native library's cache; each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import KRN, SEC, Mutant

KERNELS_MUTANTS: list[Mutant] = [
    Mutant("attention-name-case-sensitive", "kernels/backends.py",
           ".strip().lower()", ".strip()",
           (KRN + "test_reference.py::test_backend_names_ignore_case_and_spaces",),
           "BATCHPILOT_ATTENTION=CPU (or Reference) is refused as an unknown backend"),
    Mutant("use-backend-first-layer-only", "kernels/backends.py",
           "            sub.backend = backend\n    return backend",
           "            sub.backend = backend\n            break\n    return backend",
           (KRN + "test_reference.py::test_use_attention_backend_repoints_every_layer",),
           "an A/B run switches only the first attention layer: the other layers keep the old"
           " backend"),
    Mutant("decode-block-one-past-cache", "kernels/cpu_attention.py",
           "ids[1] >= num_blocks", "ids[1] > num_blocks",
           (KRN + "test_native_library.py"
            "::test_block_ids_outside_the_cache_are_rejected_not_read",),
           "a block id one past the cache is read by the C kernel: out-of-bounds memory in a"
           " decode"),
    Mutant("decode-full-table-row-refused", "kernels/cpu_plan.py",
           "if int(owned.max()) > block_tables.shape[1]:",
           "if int(owned.max()) >= block_tables.shape[1]:",
           (KRN + "test_native_library.py::test_block_table_rows_without_padding_decode",),
           "a decode at the longest context its table row holds fails with 'a row too short'"),
    Mutant("native-q-taken-as-packed", "kernels/cpu_attention.py",
           "q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == head_dim",
           "q.dtype == torch.float32 and q.stride(2) == 1",
           (KRN + "test_native_library.py"
            "::test_q_with_heads_apart_in_memory_matches_reference",),
           "a q whose heads are not packed is read as if they were: wrong attention output"),
    Mutant("kernel-name-without-headers", "kernels/native_library.py",
           "(*SOURCES, *HEADERS)", "SOURCES",
           (SEC + "test_native_cache.py::test_library_name_follows_the_headers",),
           "an edited header does not rebuild: the cached library of the old header is loaded"),
    Mutant("kernel-name-without-x86-flags", "kernels/native_library.py",
           '("model name", "flags", "CPU implementer"', '("model name", "CPU implementer"',
           (SEC + "test_native_cache.py::test_library_name_follows_the_x86_flags",),
           "two x86 machines of one model name but other flags share a -march=native library:"
           " illegal instruction"),
    Mutant("kernel-cache-link-refused", "kernels/private_cache.py",
           "return untrusted_reason(path, follow=True)", "return untrusted_reason(path)",
           (SEC + "test_native_cache.py::test_a_cache_directory_behind_a_symbolic_link_is_used",),
           "a kernel cache behind a symbolic link is bypassed: every process rebuilds the library"
           " in a temporary directory"),
    Mutant("trusted-tree-skips-folders", "kernels/private_cache.py",
           "        for name in (*dirs, *files):\n            problem = untrusted_reason",
           "        for name in files:\n            problem = untrusted_reason",
           (SEC + "test_gguf_cache_key.py"
            "::test_a_writable_folder_inside_a_converted_copy_is_not_used",),
           "a converted GGUF copy with a folder others may write is served: planted weights"),
    Mutant("fused-swiglu-width-2x", "kernels/cpu_elementwise.py",
           "3 * intermediate <= ROW_MAX", "2 * intermediate <= ROW_MAX",
           (KRN + "test_cpu_elementwise.py"
            "::test_takes_says_yes_only_to_sizes_the_kernels_take",),
           "a model of intermediate 5462..8192 (TinyLlama's 5632) is fused and its steps fail"
           " with ValueError"),
    Mutant("triton-head-dim-unchecked", "kernels/triton_launch.py",
           "    if q.shape[2] != k_cache.shape[3]:", "    if False:",
           (KRN + "test_triton.py"
            "::test_a_q_of_another_head_dim_than_the_cache_is_refused",),
           "a q of another head_dim than the cache's is attended over misread rows, no error"),
    Mutant("reference-decode-sees-padding", "kernels/reference.py",
           "hidden = positions[None, None, :] >= context_lens",
           "hidden = positions[None, None, :] > context_lens",
           (KRN + "test_reference.py"
            "::test_decodes_of_similar_lengths_batched_match_dense",),
           "the oracle's batched decodes attend to one padding key past their context"),
    Mutant("argmax-takes-any-dtype", "kernels/cpu_argmax.py",
           "values.dim() == 2 and values.dtype == torch.float32", "values.dim() == 2",
           (KRN + "test_cpu_argmax.py"
            "::test_rows_of_other_dtypes_take_torchs_path_with_its_answer",),
           "bf16 or float64 logits are read as float32 bytes: greedy picks a wrong token"),
    Mutant("plan-idle-sequence-refused", "kernels/cpu_plan.py",
           "        if q_len == 0:\n            continue\n", "",
           (KRN + "test_cpu_attention.py::test_an_idle_sequence_in_the_step_is_skipped",),
           "a step holding a sequence with no query rows fails with ValueError on the CPU"
           " backend"),
    Mutant("prefill-full-table-row-refused", "kernels/cpu_prefill.py",
           "(owned > table.shape[1]).any()", "(owned >= table.shape[1]).any()",
           (KRN + "test_cpu_prefill.py::test_block_table_rows_without_padding_prefill",),
           "a prefill chunk at the longest context its table row holds fails with ValueError"),
    Mutant("bf16-prefill-any-64x-head-dim", "kernels/cpu_prefill_amx.py",
           "kv_dtype == torch.bfloat16 and head_dim in HEAD_DIMS",
           "kv_dtype == torch.bfloat16 and head_dim % 64 == 0",
           (KRN + "test_cpu_prefill_amx.py::test_which_models_it_serves",),
           "the ready line says a head_dim 192 or 256 model's prefills run on bf16 tiles; the"
           " kernel refuses them"),
    Mutant("no-triton-hint-lost", "kernels/backends.py",
           "f\"attention backend 'triton' needs the triton package (pip install 'triton>=3.6');"
           " \"\n            f\"{_FALLBACK_HINT}\")",
           "f\"attention backend 'triton' needs the triton package (pip install 'triton>=3.6')\")",
           (KRN + "test_reference.py::test_triton_not_installed_names_the_way_out",),
           "forcing triton without the package no longer says BATCHPILOT_ATTENTION=reference"
           " runs without it"),
    Mutant("trust-follows-links", "kernels/private_cache.py",
           "def untrusted_reason(path: Path, *, follow: bool = False)",
           "def untrusted_reason(path: Path, *, follow: bool = True)",
           (SEC + "test_native_cache.py"
            "::test_a_library_that_is_a_symbolic_link_is_rebuilt_not_followed",),
           "a cached kernel library that is a symbolic link is dlopened through it"),
    Mutant("native-table-column-stride", "kernels/cpu_attention.py",
           "            and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1\n"
           "            and context_lens",
           "            and block_tables.dtype == torch.int32\n            and context_lens",
           (KRN + "test_native_library.py"
            "::test_a_block_table_with_strided_columns_matches_reference",),
           "a block table whose columns are not adjacent is read by C as if they were: decodes"
           " attend over the wrong blocks"),
    Mutant("compiler-timeout-crashes", "kernels/native_library.py",
           "except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:",
           "except (OSError, RuntimeError, ValueError) as exc:",
           (KRN + "test_native_library.py::test_a_compiler_that_hangs_falls_back",),
           "a C compiler that runs past its timeout fails the model's load instead of leaving"
           " the torch path in use"),
]
