"""The CPU weight paths: the dtype plan, projections and their bf16 twins, a GGUF file's own
blocks, and the fleet's stop-signal reach (pass of 2026-12-07, late: files no earlier pass
had planted a bug in); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, KRN, MDL, Mutant

FORM = "tests/dashboard/test_control_form.py"

LAYERS_T = KRN + "test_cpu_layers.py"
REFUSED_BEFORE_C = (KRN + "test_cpu_layers.py::"
                    "test_what_the_kernel_cannot_read_is_refused_before_c_reads_it")

CPU_WEIGHTS_MUTANTS: list[Mutant] = [
    Mutant("gguf-blocks-attached-unchecked", "engine/models/gguf_blocks.py",
           "if not torch.equal(decoded, proj.weight):", "if False:",
           (KRN + "test_cpu_gguf_layers.py::"
            "test_blocks_that_do_not_decode_to_the_weights_are_not_attached",),
           "blocks that decode to other weights than the loaded ones run small decode steps:"
           " a single stream's text silently differs from a batch's"),
    Mutant("gguf-rotary-order-kept", "engine/models/gguf_blocks.py",
           "rotary.get(part), to_gguf=False)", "None, to_gguf=False)",
           (MDL + "test_smollm2_gguf.py::"
            "test_smollm2_auto_reads_the_gguf_blocks_on_small_decode_steps",),
           "q and k rows kept in llama.cpp's order: the check refuses them, and the bundled"
           " model's single-stream steps lose the 3.5x smaller blocks"),
    Mutant("gguf-mixed-block-types-accepted", "engine/models/gguf_blocks.py",
           "if len(types) != 1 or not types <=", "if not types <=",
           (KRN + "test_cpu_gguf_layers.py::"
            "test_a_file_that_mixes_block_types_keeps_the_model_off_the_blocks",),
           "a GGUF whose v rows are Q8_0 beside Q4_1 q and k (a per-tensor override) fails"
           " the model's load instead of leaving the blocks out"),
    Mutant("gguf-layers-of-two-types-accepted", "engine/models/gguf_blocks.py",
           "if len({gguf_type for *_, gguf_type in found}) != 1:", "if False:",
           (KRN + "test_cpu_gguf_layers.py::"
            "test_a_file_that_mixes_block_types_keeps_the_model_off_the_blocks",),
           "a GGUF whose last layer is Q8_0 runs every layer's blocks as Q4_1"),
    Mutant("gguf-array-of-scalars-skipped-short", "engine/models/gguf_blocks.py",
           "return pos + count * struct.calcsize(_SCALARS[item])", "return pos + count",
           (MDL + "test_smollm2_gguf.py::"
            "test_smollm2_auto_reads_the_gguf_blocks_on_small_decode_steps",),
           "the tensor index is read from the wrong offset past an array of numbers"),
    Mutant("dtype-auto-on-cuda-float32", "engine/models/cpu_dtype.py",
           'return DtypePlan(choice, torch.bfloat16, None, f"auto on {device.type}")',
           'return DtypePlan(choice, torch.float32, None, f"auto on {device.type}")',
           (MDL + "test_cpu_dtype.py::test_auto_on_cuda_and_explicit_choices",),
           "a GPU server runs every weight in float32: half the speed, twice the memory"),
    Mutant("dtype-avx512-bf16-ignored", "engine/models/cpu_dtype.py",
           'BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")', 'BF16_CPU_FLAGS = ("amx_bf16",)',
           (MDL + "test_cpu_dtype.py",),
           "an AMD Zen 4 CPU runs auto in float32, without its bf16 dot products"),
    Mutant("dtype-kv-cache-bf16-for-plain-plan", "engine/models/cpu_dtype.py",
           "native_bf16 = plan is not None and plan.bf16_min_rows == BF16_MIN_ROWS_NATIVE",
           "native_bf16 = plan is not None and plan.bf16_min_rows is not None",
           (MDL + "test_cpu_dtype.py",),
           "a CPU without the native layers keeps a bf16 cache its torch path converts every"
           " decode: decode attention 0.3-0.5x as fast"),
    Mutant("projection-bf16-bias-dropped", "engine/models/projections.py",
           "        out = self._bf16_product(x, torch.bfloat16)\n"
           "        return out if self.bias is None else out + self.bias",
           "        out = self._bf16_product(x, torch.bfloat16)\n        return out",
           (MDL + "test_projections_packed.py::test_float_forward_is_forward_widened",),
           "a Qwen2 model (biased q, k, v) loses its biases on every bf16 step"),
    Mutant("projection-fuse-on-some-parts", "engine/models/projections.py",
           "if all(name in state_dict for name in names):",
           "if any(name in state_dict for name in names):",
           (MDL + "test_fused_projections.py::"
            "test_a_state_dict_missing_one_part_is_refused_by_name",),
           "a checkpoint missing one of q / k / v fails with a KeyError instead of naming"
           " the missing weight"),
    Mutant("native-layers-format-swapped", "kernels/cpu_layers.py",
           "return FORMAT_FLOAT32 if weight.dtype == torch.float32 else FORMAT_BFLOAT16",
           "return FORMAT_BFLOAT16 if weight.dtype == torch.float32 else FORMAT_FLOAT32",
           (KRN + "test_cpu_layers.py",),
           "the native layers read float32 weights as bf16 pairs: every small step's output"
           " is noise"),
    Mutant("native-layers-cache-dtype-unchecked", "kernels/cpu_layers.py",
           "if cache.dtype not in (torch.float32, torch.bfloat16):", "if False:",
           (REFUSED_BEFORE_C,),
           "a float16 KV cache is read by C as bf16 or float32: garbage attention, no error"),
    Mutant("native-row-width-unchecked", "kernels/cpu_layers.py",
           "if weight.dim() != 2 or width < 0 or weight.shape[1] != width:",
           "if weight.dim() != 2 or width < 0:",
           (KRN + "test_cpu_gguf_layers.py",),
           "blocks of another width are read past their rows' end by C"),
    Mutant("native-projection-rows-unchecked", "kernels/cpu_layers.py",
           '        raise ValueError(f"{rows=} must be in 1..{MAX_ROWS} (native projection)")',
           "        pass",
           (REFUSED_BEFORE_C,),
           "a projection of more rows than the kernel takes returns uninitialised memory"),
    Mutant("fused-layers-last-norm-skipped", "engine/models/fused_layers.py",
           "following = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else None",
           "following = layers[i + 1].input_layernorm.weight if i + 2 < len(layers) else None",
           (KRN + "test_cpu_elementwise.py",),
           "the second-to-last layer's output skips the last layer's input norm on bf16"
           " prefill steps: wrong logits for every prompt"),
    Mutant("fused-layers-any-backend", "engine/models/fused_layers.py",
           ' and layers[0].self_attn.attn.backend.name == "cpu"', "",
           (KRN + "test_cpu_elementwise.py::"
            "test_a_model_on_another_attention_backend_is_not_fused",),
           "a model on the Triton or reference backend runs the CPU attention anyway"),
    Mutant("control-form-empty-groups-sent", "dashboard/control_form.py",
           "            if sub:\n", "            if True:\n",
           (FORM,),
           "a Control form left alone sends {\"lanes\": {...: {}}}: a config version and an"
           " audit row for a change nobody made"),
    Mutant("control-form-empty-cell-sent", "dashboard/control_form.py",
           '    if value == "":\n        return None\n', "",
           (FORM,),
           "a cell the operator emptied is sent as \"\", which the server refuses, so the"
           " lane's SLO cannot be given back to the default"),
    Mutant("control-form-half-slo-dropped", "dashboard/control_form.py",
           "if all(v is None for v in slo.values()):", "if any(v is None for v in slo.values()):",
           (FORM,),
           "a lane given only a TTFT target (TPOT empty) is sent with no SLO at all"),
    Mutant("native-decode-any-backend", "engine/models/native_decode.py",
           '            and model.model.layers[0].self_attn.attn.backend.name == "cpu"):',
           "            ):", (LAYERS_T,),
           "a model asked to run the Triton or reference attention runs the native one"),
    Mutant("native-decode-block-one-past", "engine/models/native_decode.py",
           "and ids[1] < k_cache.shape[0])", "and ids[1] <= k_cache.shape[0])", (LAYERS_T,),
           "a decode whose block table names the block past the cache has C read past it"),
    Mutant("native-decode-int64-lengths", "engine/models/native_decode.py",
           "if not (tables.dtype == ctx.dtype == torch.int32 and tables.stride(1) == 1",
           "if not (tables.dtype == torch.int32 and tables.stride(1) == 1", (LAYERS_T,),
           "int64 context lengths are read by C as pairs of int32: every other one 0"),
    Mutant("native-logits-bf16-step-on-fp32", "engine/models/native_decode.py",
           "weight = head.weight_bf16 if model.uses_bf16(rows) else head.weight",
           "weight = head.weight", (LAYERS_T,),
           "a bf16 step's logits come from the float32 head: they disagree with the same"
           " step's bf16 layers (and with a batched step's logits)"),
    Mutant("signal-reach-zombie-alive", "control/fleet/signal_reach.py",
           'if int(ppid) == parent and state != "Z":', "if int(ppid) == parent:",
           (CTL + "fleet/test_fleet_signal_reach.py",),
           "a Ray process that died on the signal but is not reaped yet is not named"),
]
