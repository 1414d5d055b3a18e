"""Greedy agreement of the fast weight paths with float32 on the parity prompts.

dtype `auto` runs prefills and big steps on bf16 copies of the weights and small decode
steps on the native layers (bf16 copies, or a GGUF's own blocks, which decode to the
float32 weights exactly); `bfloat16` runs everything in bf16. None of them is float32, so
their greedy tokens drift from it; this measures how far, on the 16 parity prompts of the
tests (tests/llm/helpers.py), each generating --tokens greedy tokens:

    auto batched        all prompts at once (prefills and decodes of up to 16 rows)
    auto one at a time  one prompt per generate call (single-row decode steps)
    auto batched, float32 prefill attention
                        `auto batched` with every prefill chunk in the float32 native
                        kernel: what the bf16 routes for long chunks cost (the AMX kernel,
                        kernels/cpu_prefill_amx.py, else torch's bf16 SDPA,
                        kernels/cpu_prefill_sdpa.py); the parity prompts are short, so take
                        --context 300 to send their prefills there
    auto batched, float32 decode attention
                        `auto batched` with decodes over more than 16 keys in float32
                        products (native_library.AMX_DECODE off): what their bf16 products
                        on AMX (kernels/cpu_decode_amx.h) cost
    bfloat16 batched    all prompts at once

--context N puts ~N tokens of shared text (a document the prompts ask about) before each
prompt.

per side: the share of positions equal to float32's, the sequences identical throughout,
and after how many tokens the others first differ (a differing token sends the rest of
its sequence elsewhere, so the positions understate how close the logits are).

    python -m bench.dtype_agreement [--tokens 32] [--threads 2] [--context 300]
    python -m bench.dtype_agreement --smoke     # the tests' tiny model, seconds
"""

from __future__ import annotations

import argparse
import sys
from unittest import mock

from bench.offline_throughput import TEXT
from bench.random_models import run_bench
from engine.llm import LLM
from engine.request import SamplingParams
from kernels import cpu_prefill_amx, cpu_prefill_sdpa, native_library
from tests.llm.helpers import PROMPTS

# (name, dtype, one prompt at a time, the bf16 prefill routes on: AMX, else SDPA,
#  decodes' bf16 products on AMX)
SIDES = (("auto batched", "auto", False, True, True),
         ("auto one at a time", "auto", True, True, True),
         ("auto batched, float32 prefill attention", "auto", False, False, True),
         ("auto batched, float32 decode attention", "auto", False, True, False),
         ("bfloat16 batched", "bfloat16", False, True, True))
SMOKE = {"tokens": 6, "context": 40}
CHARS_PER_TOKEN = 4  # English text in SmolLM2's tokenizer, roughly


def prompts_with_context(tokens: int) -> list[str]:
    """The parity prompts, each after ~`tokens` tokens of the same document (none for 0)."""
    if tokens <= 0:
        return list(PROMPTS)
    document = (TEXT * (1 + tokens * CHARS_PER_TOKEN // len(TEXT)))[:tokens * CHARS_PER_TOKEN]
    return [f"{document}\n\n{prompt}" for prompt in PROMPTS]


def generate(model: str, dtype: str, one_at_a_time: bool, sdpa: bool, amx_decode: bool,
             tokens: int, prompts: list[str]) -> list[list[int]]:
    llm = LLM(model, dtype=dtype)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    with mock.patch.object(cpu_prefill_sdpa, "SDPA_PREFILL", sdpa), \
            mock.patch.object(cpu_prefill_amx, "AMX_PREFILL", sdpa), \
            mock.patch.object(native_library, "AMX_DECODE", amx_decode):
        if one_at_a_time:
            return [llm.generate([p], params, use_tqdm=False)[0].token_ids for p in prompts]
        return [out.token_ids for out in llm.generate(prompts, params, use_tqdm=False)]


def agreement(reference: list[list[int]], got: list[list[int]]) -> dict:
    same = sum(a == b for ref, out in zip(reference, got, strict=True)
               for a, b in zip(ref, out, strict=True))
    firsts = [next((i for i, (a, b) in enumerate(zip(ref, out, strict=True)) if a != b), None)
              for ref, out in zip(reference, got, strict=True)]
    return {"positions": same / sum(map(len, reference)),
            "identical": sum(f is None for f in firsts), "sequences": len(reference),
            "first_differences": sorted(f for f in firsts if f is not None)}


def measure(model: str, args: argparse.Namespace) -> dict:
    prompts = prompts_with_context(args.context)
    reference = generate(model, "float32", False, True, True, args.tokens, prompts)
    sides = {}
    for name, dtype, single, sdpa, amx_decode in SIDES:
        sides[name] = agreement(reference, generate(model, dtype, single, sdpa, amx_decode,
                                                    args.tokens, prompts))
        side = sides[name]
        print(f"  {name:<40} {side['positions']:4.0%} of positions, {side['identical']} of"
              f" {side['sequences']} identical, first differences after"
              f" {side['first_differences']} tokens", file=sys.stderr, flush=True)
    return {"model": model, "tokens": args.tokens, "context": args.context, "sides": sides}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias, checkpoint or .gguf")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--context", type=int, default=0,
                    help="~tokens of shared text before each prompt (0: the prompts alone)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    run_bench("dtype_agreement", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
