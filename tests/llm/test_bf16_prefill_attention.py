"""Long prompts of SmolLM2 in dtype auto take the tiled prefill kernel inside the engine (on
AMX, kernels/cpu_prefill_amx.c, or on a CPU without it AVX-512-BF16, kernels/cpu_prefill_bf16.c),
and their prompt logprobs stay as close to float32's as torch's bf16 SDPA route keeps them. A
kernel wired wrong (a head, a block, a causal edge) moves the logprobs by far more than bf16
rounding does (measured: mean |delta| ~0.02 either route)."""

from __future__ import annotations

import statistics
from unittest import mock

from fixtures.native_build import require_tiles

from bench.dtype_agreement import prompts_with_context
from engine import LLM, SamplingParams
from engine.models import load_model
from engine.models.cpu_dtype import cpu_bf16_flags
from kernels import cpu_prefill_amx

PROMPTS = 4
CONTEXT_TOKENS = 300  # each prompt's prefill: ~330 rows, far past the kernel's bounds


def _prompt_logprobs(loaded, prompts: list[str]) -> list[list[float]]:
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = LLM(loaded).generate(prompts, params, use_tqdm=False)
    return [[lp.logprob for lp in out.prompt_logprobs] for out in outs]


def _mean_delta(a: list[list[float]], b: list[list[float]]) -> float:
    return statistics.mean(abs(x - y) for ra, rb in zip(a, b, strict=True)
                           for x, y in zip(ra, rb, strict=True))


def test_long_prompts_on_the_tiled_kernel_keep_float32_prompt_logprobs(smollm2):
    # the machine's own tiles; fails under CI on a CPU with the flag, skips elsewhere
    require_tiles("AMX" if "amx_bf16" in cpu_bf16_flags() else "AVX512-BF16")
    prompts = prompts_with_context(CONTEXT_TOKENS)[:PROMPTS]
    reference = _prompt_logprobs(smollm2, prompts)  # float32 model, float32 cache
    auto = load_model("smollm2-135m", dtype="auto")  # the session's converted GGUF
    with mock.patch.object(cpu_prefill_amx, "prefill_attention",
                           wraps=cpu_prefill_amx.prefill_attention) as amx:
        on_amx = _prompt_logprobs(auto, prompts)
    assert amx.call_count >= auto.model.num_layers  # every layer of the prefill step
    with mock.patch.object(cpu_prefill_amx, "AMX_PREFILL", False):
        on_sdpa = _prompt_logprobs(auto, prompts)
    amx_delta, sdpa_delta = _mean_delta(on_amx, reference), _mean_delta(on_sdpa, reference)
    assert amx_delta < 0.05, amx_delta
    assert amx_delta <= 1.25 * sdpa_delta, (amx_delta, sdpa_delta)
