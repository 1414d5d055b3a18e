"""Greedy output token for token equal to transformers, under three engine regimes."""

from __future__ import annotations

import pytest
from helpers import PROMPTS, greedy_reference

from engine import LLM, SamplingParams
from engine.models import load_model

NUM_TOKENS = 12

REGIMES = {
    # a pool big enough for everything at once
    "large_kv": {"num_kv_blocks": 512, "max_num_batched_tokens": 4096},
    # chunks smaller than most prompts, and a budget that splits the batch
    "chunked": {"num_kv_blocks": 512, "prefill_chunk_size": 8, "max_num_batched_tokens": 40},
    # too few blocks for all sequences at once: running requests get preempted
    "small_kv": {"num_kv_blocks": 14, "block_size": 16, "max_num_batched_tokens": 256,
                 "kv_cache_high_watermark": 0.99, "kv_cache_reject_watermark": 1.0},
}


_EXPECTED: dict[int, list[list[int]]] = {}  # transformers' tokens, once per model


def _check_parity(loaded, regime: str, prompts: list[str]) -> None:
    tok = loaded.tokenizer
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    key = id(loaded.reference)
    if key not in _EXPECTED:
        _EXPECTED[key] = [greedy_reference(loaded.reference, ids, NUM_TOKENS)
                          for ids in prompt_ids]
    expected = _EXPECTED[key]
    llm = LLM(loaded, **REGIMES[regime])
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompt_ids, params, use_tqdm=False)
    got = [o.token_ids for o in outs]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"prompt {i} ({prompts[i]!r}) differs under {regime}"
    assert all(o.finish_reason == "length" for o in outs)
    preemptions = sum(o.record.num_preemptions for o in outs)
    if regime == "small_kv":
        assert preemptions > 0, "the small pool was meant to force preemptions"
    llm.engine.check_integrity()
    assert llm.engine.block_manager.num_used == 0


@pytest.fixture(scope="module")
def tiny_models(tiny_llama_dir, tiny_qwen2_dir):
    # float32: token-for-token parity with transformers is a float32 property
    return {"llama": load_model(tiny_llama_dir, dtype="float32", keep_reference=True),
            "qwen2": load_model(tiny_qwen2_dir, dtype="float32", keep_reference=True)}


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_models_match_transformers(arch, regime, tiny_models):
    _check_parity(tiny_models[arch], regime, PROMPTS)


@pytest.mark.parametrize("regime", ["chunked", "small_kv"])
def test_smollm2_matches_transformers(regime, smollm2):
    _check_parity(smollm2, regime, PROMPTS)
